//! One test body, both drivers: [`Blocking`] (the blocking API on a connection of the
//! test's r2d2 pool) and, with the async features, [`Async`] (the async API on a
//! diesel-async connection to the same database, driven from the test's thread);
//! [`BlockingPool`] and [`AsyncPool`] for the calls that take a pool. Each trait here is
//! one operation, generic in the entity, so a body names the writes it makes
//! (`W: Insert<Order> + Delete<Order>`) and runs unchanged on both drivers.
//!
//! Unlike [`paths`](super::paths), this module is there without the `async` feature: the
//! blocking half of a body still runs with the default features, and
//! [`tests_on_both_drivers!`] writes the async half only when the async API is built.

use diesel::associations::HasTable;
use diesel::connection::{Connection, LoadConnection};
use diesel::Column;
use diesel_occ::__private::NoChanges;
use diesel_occ::{
    AdvanceInSql, Advancing, BatchMode, BatchReport, BulkReport, ConnectionSource, DeleteRow,
    EditJson, Error, Guarded, GuardedBatch, GuardedBulk, GuardedJson, GuardedJsonMerge,
    GuardedModify, GuardedWrite, InsertRow, LoadByKey, MergeInPlace, Modified, OccBackend,
    RetryPolicy, TokenOf, UpdateBatch, UpdateBulk, UpdateRow, UpsertRow, Upserted,
    WriteTransaction,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

#[cfg(all(
    feature = "async",
    any(not(feature = "mysql"), feature = "async-mysql")
))]
#[allow(unused_imports)] // Unused in the test binaries without async bodies.
pub use on_async::*;

/// The blocking API on connection `C`.
pub struct Blocking<C>(pub C);

/// The blocking API on pool `S` (r2d2, deadpool-diesel: any [`ConnectionSource`]): each
/// call checks its connections out of it.
pub struct BlockingPool<S>(pub S);

/// A guarded insert.
pub trait Insert<T: Guarded> {
    fn insert(&mut self, row: &mut T) -> Result<TokenOf<T>, Error>;
}

/// A guarded upsert.
pub trait Upsert<T: Guarded> {
    fn upsert(&mut self, row: &mut T) -> Result<Upserted<TokenOf<T>>, Error>;
    /// In one transaction of the caller's, upserts each of `rows` in turn whatever the
    /// earlier ones answered, then commits: each upsert's answer, or the transaction's
    /// failure (a `COMMIT` refused because a failed statement aborted the transaction).
    #[allow(clippy::type_complexity)]
    fn upsert_each_in_transaction(
        &mut self,
        rows: Vec<T>,
    ) -> Result<Vec<Result<Upserted<TokenOf<T>>, Error>>, Error>;
}

/// A guarded delete.
pub trait Delete<T: Guarded> {
    fn delete(&mut self, row: &T) -> Result<(), Error>;
}

/// A batch of guarded updates by key and token, each with its changes.
pub trait BatchUpdate<T: Guarded, Ch> {
    #[allow(clippy::type_complexity)]
    fn update_batch(
        &mut self,
        rows: Vec<(T::Key, TokenOf<T>, Ch)>,
        mode: BatchMode,
    ) -> Result<BatchReport<TokenOf<T>>, Error>;
}

/// A guarded delete by key and the token the caller saw.
pub trait DeleteByKey<T: Guarded> {
    fn delete_by_key(&mut self, key: &T::Key, expected: &TokenOf<T>) -> Result<(), Error>;
}

/// A batch of guarded deletes by key and token.
pub trait DeleteBatch<T: Guarded> {
    fn delete_batch(
        &mut self,
        rows: Vec<(T::Key, TokenOf<T>)>,
        mode: BatchMode,
    ) -> Result<BatchReport<()>, Error>;
}

/// A guarded touch: the token advances, nothing else changes.
pub trait Touch<T: Guarded> {
    fn touch(&mut self, row: &mut T) -> Result<TokenOf<T>, Error>;
}

/// A guarded save of every updatable field.
pub trait Save<T: Guarded> {
    fn save(&mut self, row: &mut T) -> Result<TokenOf<T>, Error>;
}

/// A guarded update with changes `Ch`.
pub trait Update<T: Guarded, Ch> {
    fn update(&mut self, row: &T, changes: Ch) -> Result<TokenOf<T>, Error>;
}

/// A guarded update by key and the token the caller saw (a stateless client's).
pub trait UpdateByKey<T: Guarded, Ch> {
    fn update_by_key(
        &mut self,
        key: &T::Key,
        expected: &TokenOf<T>,
        changes: Ch,
    ) -> Result<TokenOf<T>, Error>;
}

/// The row with `key` as committed, by a plain read on the executor's connection (the
/// library's own read by key).
pub trait Read<T: Guarded> {
    fn read(&mut self, key: &T::Key) -> Option<T>;
}

/// A guarded update inside a transaction of the caller's, which then commits or (without
/// `commit`) rolls back, whatever the update answered: the update's answer, and the
/// transaction's.
pub trait UpdateInTransaction<T: Guarded, Ch> {
    #[allow(clippy::type_complexity)]
    fn update_in_transaction(
        &mut self,
        row: &T,
        changes: Ch,
        commit: bool,
    ) -> (Result<TokenOf<T>, Error>, Result<(), Error>);
}

/// What a transaction that rolls back on purpose answers.
fn rolled_back() -> Error {
    Error::Database(diesel::result::Error::RollbackTransaction)
}

/// A guarded bulk update: `changes` on every row `filter` matches, each one's token
/// advanced.
pub trait BulkUpdate<T: Guarded, F, Ch> {
    fn bulk_update(&mut self, filter: F, changes: Ch) -> Result<BulkReport, Error>;
}

/// Read-merge-write edits of the JSON document in column `Col`, each retried by `policy`
/// (the library's `GuardedJson`). The edits given are `Send + 'static` on both drivers: on
/// SQLite the async call runs them on the connection's thread.
pub trait EditJsonColumn<T: Guarded, Col> {
    fn merge_json(
        &mut self,
        key: &T::Key,
        column: Col,
        patch: &Value,
        policy: &RetryPolicy,
    ) -> Result<Modified<T, ()>, Error>;
    fn patch_json(
        &mut self,
        key: &T::Key,
        column: Col,
        patch: &json_patch::Patch,
        policy: &RetryPolicy,
    ) -> Result<Modified<T, ()>, Error>;
    fn set_json(
        &mut self,
        key: &T::Key,
        column: Col,
        pointer: &str,
        value: Value,
        policy: &RetryPolicy,
    ) -> Result<Modified<T, ()>, Error>;
    fn remove_json(
        &mut self,
        key: &T::Key,
        column: Col,
        pointer: &str,
        policy: &RetryPolicy,
    ) -> Result<Modified<T, ()>, Error>;
    fn edit_json(
        &mut self,
        key: &T::Key,
        column: Col,
        policy: &RetryPolicy,
        edit: impl FnMut(&mut Value) -> Result<(), Error> + Send + 'static,
    ) -> Result<Modified<T, ()>, Error>;
    fn update_json_as<D: Serialize + DeserializeOwned + 'static>(
        &mut self,
        key: &T::Key,
        column: Col,
        policy: &RetryPolicy,
        edit: impl FnMut(&mut D) -> Result<(), Error> + Send + 'static,
    ) -> Result<Modified<T, ()>, Error>;
}

/// One-statement merges into the JSON document in column `Col` (the library's
/// `GuardedJsonMerge`).
pub trait MergeJsonInPlace<T: Guarded, Col> {
    fn merge_json_in_place(
        &mut self,
        key: &T::Key,
        column: Col,
        patch: &Value,
    ) -> Result<TokenOf<T>, Error>;
}

/// Read-modify-write on the executor's connection, whose closure returns `R` or stops
/// with `E`. The closure is `Send + 'static` on both drivers: on SQLite the async call
/// runs it on the connection's thread.
pub trait Modify<T: Guarded, R, E> {
    fn modify(
        &mut self,
        key: &T::Key,
        policy: &RetryPolicy,
        change: impl FnMut(&mut T) -> Result<R, E> + Send + 'static,
    ) -> Result<Modified<T, R>, E>;
    /// [`modify`](Self::modify) inside a transaction of the caller's, which commits
    /// whatever the modify answered: the modify's answer, or the transaction's failure.
    fn modify_in_transaction(
        &mut self,
        key: &T::Key,
        policy: &RetryPolicy,
        change: impl FnMut(&mut T) -> Result<R, E> + Send + 'static,
    ) -> Result<Result<Modified<T, R>, E>, Error>;
}

/// Read-modify-write on connections from the executor's pool, from any thread.
pub trait ModifyPooled<T: Guarded, R, E>: Sync {
    fn modify_pooled(
        &self,
        key: &T::Key,
        policy: &RetryPolicy,
        change: impl FnMut(&mut T) -> Result<R, E> + Send + 'static,
    ) -> Result<Modified<T, R>, E>;
}

impl<C, T: InsertRow<C>> Insert<T> for Blocking<C> {
    fn insert(&mut self, row: &mut T) -> Result<TokenOf<T>, Error> {
        row.guarded_insert(&mut self.0)
    }
}

impl<C: Connection, T: UpsertRow<C>> Upsert<T> for Blocking<C> {
    fn upsert(&mut self, row: &mut T) -> Result<Upserted<TokenOf<T>>, Error> {
        row.guarded_upsert(&mut self.0)
    }
    fn upsert_each_in_transaction(
        &mut self,
        rows: Vec<T>,
    ) -> Result<Vec<Result<Upserted<TokenOf<T>>, Error>>, Error> {
        self.0.transaction::<_, Error, _>(|conn| {
            Ok(rows
                .into_iter()
                .map(|mut row| row.guarded_upsert(conn))
                .collect())
        })
    }
}

impl<C, T: DeleteRow<C>> Delete<T> for Blocking<C> {
    fn delete(&mut self, row: &T) -> Result<(), Error> {
        row.guarded_delete(&mut self.0)
    }
}

impl<C: WriteTransaction, T: UpdateBatch<C, Ch>, Ch> BatchUpdate<T, Ch> for Blocking<C> {
    fn update_batch(
        &mut self,
        rows: Vec<(T::Key, TokenOf<T>, Ch)>,
        mode: BatchMode,
    ) -> Result<BatchReport<TokenOf<T>>, Error> {
        T::guarded_update_batch(&mut self.0, rows, mode)
    }
}

impl<C, T: DeleteRow<C>> DeleteByKey<T> for Blocking<C> {
    fn delete_by_key(&mut self, key: &T::Key, expected: &TokenOf<T>) -> Result<(), Error> {
        T::guarded_delete_by_key(&mut self.0, key, expected)
    }
}

impl<C: WriteTransaction, T: DeleteRow<C>> DeleteBatch<T> for Blocking<C> {
    fn delete_batch(
        &mut self,
        rows: Vec<(T::Key, TokenOf<T>)>,
        mode: BatchMode,
    ) -> Result<BatchReport<()>, Error> {
        T::guarded_delete_batch(&mut self.0, rows, mode)
    }
}

impl<C, T> Touch<T> for Blocking<C>
where
    T: Guarded<Guard: Advancing> + UpdateRow<C, NoChanges<<T as HasTable>::Table>>,
{
    fn touch(&mut self, row: &mut T) -> Result<TokenOf<T>, Error> {
        row.guarded_touch(&mut self.0)
    }
}

impl<C, T> Save<T> for Blocking<C>
where
    T: Guarded<Guard: Advancing> + UpdateRow<C, <T as Guarded>::Changes>,
{
    fn save(&mut self, row: &mut T) -> Result<TokenOf<T>, Error> {
        row.guarded_save(&mut self.0)
    }
}

impl<C, T: UpdateRow<C, Ch>, Ch> Update<T, Ch> for Blocking<C> {
    fn update(&mut self, row: &T, changes: Ch) -> Result<TokenOf<T>, Error> {
        row.guarded_update(&mut self.0, changes)
    }
}

impl<C, T: UpdateRow<C, Ch>, Ch> UpdateByKey<T, Ch> for Blocking<C> {
    fn update_by_key(
        &mut self,
        key: &T::Key,
        expected: &TokenOf<T>,
        changes: Ch,
    ) -> Result<TokenOf<T>, Error> {
        T::guarded_update_by_key(&mut self.0, key, expected, changes)
    }
}

impl<C, T: LoadByKey<C>> Read<T> for Blocking<C> {
    fn read(&mut self, key: &T::Key) -> Option<T> {
        T::read_by_key(&mut self.0, key).unwrap()
    }
}

impl<C: Connection, T: UpdateRow<C, Ch>, Ch> UpdateInTransaction<T, Ch> for Blocking<C> {
    fn update_in_transaction(
        &mut self,
        row: &T,
        changes: Ch,
        commit: bool,
    ) -> (Result<TokenOf<T>, Error>, Result<(), Error>) {
        let mut answer = None;
        let outcome = self.0.transaction::<_, Error, _>(|conn| {
            answer = Some(row.guarded_update(conn, changes));
            if commit {
                Ok(())
            } else {
                Err(rolled_back())
            }
        });
        (answer.expect("the transaction ran"), outcome)
    }
}

impl<C, T, F, Ch> BulkUpdate<T, F, Ch> for Blocking<C>
where
    T: Guarded<Guard: AdvanceInSql> + UpdateBulk<C, F, Ch>,
{
    fn bulk_update(&mut self, filter: F, changes: Ch) -> Result<BulkReport, Error> {
        T::guarded_bulk_update(&mut self.0, filter, changes)
    }
}

impl<C, T, Col> EditJsonColumn<T, Col> for Blocking<C>
where
    T: Guarded + EditJson<C, Col>,
    Col: Column,
{
    fn merge_json(
        &mut self,
        key: &T::Key,
        column: Col,
        patch: &Value,
        policy: &RetryPolicy,
    ) -> Result<Modified<T, ()>, Error> {
        T::merge_json(&mut self.0, key, column, patch, policy)
    }
    fn patch_json(
        &mut self,
        key: &T::Key,
        column: Col,
        patch: &json_patch::Patch,
        policy: &RetryPolicy,
    ) -> Result<Modified<T, ()>, Error> {
        T::patch_json(&mut self.0, key, column, patch, policy)
    }
    fn set_json(
        &mut self,
        key: &T::Key,
        column: Col,
        pointer: &str,
        value: Value,
        policy: &RetryPolicy,
    ) -> Result<Modified<T, ()>, Error> {
        T::set_json(&mut self.0, key, column, pointer, value, policy)
    }
    fn remove_json(
        &mut self,
        key: &T::Key,
        column: Col,
        pointer: &str,
        policy: &RetryPolicy,
    ) -> Result<Modified<T, ()>, Error> {
        T::remove_json(&mut self.0, key, column, pointer, policy)
    }
    fn edit_json(
        &mut self,
        key: &T::Key,
        column: Col,
        policy: &RetryPolicy,
        edit: impl FnMut(&mut Value) -> Result<(), Error> + Send + 'static,
    ) -> Result<Modified<T, ()>, Error> {
        <T as GuardedJson>::edit_json(&mut self.0, key, column, policy, edit)
    }
    fn update_json_as<D: Serialize + DeserializeOwned + 'static>(
        &mut self,
        key: &T::Key,
        column: Col,
        policy: &RetryPolicy,
        edit: impl FnMut(&mut D) -> Result<(), Error> + Send + 'static,
    ) -> Result<Modified<T, ()>, Error> {
        <T as GuardedJson>::update_json_as(&mut self.0, key, column, policy, edit)
    }
}

impl<C, T, Col> MergeJsonInPlace<T, Col> for Blocking<C>
where
    T: Guarded<Guard: AdvanceInSql> + MergeInPlace<C, Col>,
{
    fn merge_json_in_place(
        &mut self,
        key: &T::Key,
        column: Col,
        patch: &Value,
    ) -> Result<TokenOf<T>, Error> {
        <T as GuardedJsonMerge>::merge_json_in_place(&mut self.0, key, column, patch)
    }
}

impl<C, T, R, E> Modify<T, R, E> for Blocking<C>
where
    C: LoadConnection + WriteTransaction,
    C::Backend: OccBackend,
    T: Clone + UpdateRow<C, <T as Guarded>::Changes>,
    E: From<Error>,
{
    fn modify(
        &mut self,
        key: &T::Key,
        policy: &RetryPolicy,
        change: impl FnMut(&mut T) -> Result<R, E> + Send + 'static,
    ) -> Result<Modified<T, R>, E> {
        T::modify(&mut self.0, key, policy, change)
    }
    fn modify_in_transaction(
        &mut self,
        key: &T::Key,
        policy: &RetryPolicy,
        change: impl FnMut(&mut T) -> Result<R, E> + Send + 'static,
    ) -> Result<Result<Modified<T, R>, E>, Error> {
        self.0
            .transaction::<_, Error, _>(|conn| Ok(T::modify(conn, key, policy, change)))
    }
}

impl<S, T, R, E> ModifyPooled<T, R, E> for BlockingPool<S>
where
    S: ConnectionSource + Sync,
    S::Connection: LoadConnection + WriteTransaction,
    <S::Connection as Connection>::Backend: OccBackend,
    T: Clone + UpdateRow<S::Connection, <T as Guarded>::Changes>,
    E: From<Error>,
{
    fn modify_pooled(
        &self,
        key: &T::Key,
        policy: &RetryPolicy,
        change: impl FnMut(&mut T) -> Result<R, E> + Send + 'static,
    ) -> Result<Modified<T, R>, E> {
        T::modify_pooled(&self.0, key, policy, change)
    }
}

/// Runs `work(t, executor)` on `threads` threads that start together, each with an
/// executor of its own made by `make` before the start; the results in thread order.
pub fn race<W, R: Send>(
    threads: usize,
    make: impl Fn() -> W + Sync,
    work: impl Fn(usize, &mut W) -> R + Sync,
) -> Vec<R> {
    let (start, make, work) = (std::sync::Barrier::new(threads), &make, &work);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let start = &start;
                s.spawn(move || {
                    let mut executor = make();
                    start.wait();
                    work(t, &mut executor)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[cfg(all(
    feature = "async",
    any(not(feature = "mysql"), feature = "async-mysql")
))]
mod on_async {
    use super::*;

    pub use super::super::paths::Async;
    use diesel_async::AsyncConnection;
    use diesel_occ::asynchronous::{
        AsyncConnectionSource, AsyncGuardedBatch, AsyncGuardedBulk, AsyncGuardedJson,
        AsyncGuardedModify, AsyncGuardedWrite, AsyncLoadByKey, AsyncRun,
    };
    use diesel_occ::op;

    /// An edit of a JSON document, boxed so that one bound names it.
    pub type BoxedEdit<R, E> = Box<dyn FnMut(&mut Value) -> Result<R, E> + Send>;

    /// The closure of an async read-modify-write, boxed so that one bound names it.
    pub type Change<T, R, E> = Box<dyn FnMut(&mut T) -> Result<R, E> + Send>;

    /// The async API on pool `P` (bb8, deadpool: any [`AsyncConnectionSource`]), driven by
    /// `runtime` from any thread: each call blocks its thread on the runtime.
    pub struct AsyncPool<P> {
        pub pool: P,
        pub runtime: tokio::runtime::Runtime,
    }

    /// A pool manager of connections `A` to `url`; on SQLite (`backend`) they wait for the
    /// write lock, as the test pools' do.
    #[cfg(any(feature = "bb8", feature = "async-deadpool"))]
    pub fn manager<A>(
        url: &str,
        backend: &str,
    ) -> diesel_async::pooled_connection::AsyncDieselConnectionManager<A>
    where
        A: AsyncConnection + 'static,
    {
        let mut config = diesel_async::pooled_connection::ManagerConfig::default();
        if backend == "sqlite" {
            config.custom_setup = Box::new(|url| {
                Box::pin(async move {
                    let mut conn = A::establish(url).await?;
                    conn.batch_execute("PRAGMA busy_timeout = 60000")
                        .await
                        .map_err(diesel::ConnectionError::CouldntSetupConfiguration)?;
                    Ok(conn)
                })
            });
        }
        diesel_async::pooled_connection::AsyncDieselConnectionManager::new_with_config(url, config)
    }

    impl<P> AsyncPool<P> {
        /// The pool `build` makes, on a runtime of its own.
        pub fn build(build: impl std::future::Future<Output = P>) -> Self {
            let runtime = super::super::paths::runtime();
            let pool = runtime.block_on(build);
            AsyncPool { pool, runtime }
        }
    }

    impl<A, T: Guarded + Clone> Insert<T> for Async<A>
    where
        op::Insert<T>: AsyncRun<A>,
    {
        fn insert(&mut self, row: &mut T) -> Result<TokenOf<T>, Error> {
            self.runtime
                .block_on(AsyncGuardedWrite::guarded_insert(row, &mut self.conn))
        }
    }

    impl<A, T> Upsert<T> for Async<A>
    where
        A: AsyncConnection,
        T: Guarded + Clone,
        op::Upsert<T>: AsyncRun<A>,
    {
        fn upsert(&mut self, row: &mut T) -> Result<Upserted<TokenOf<T>>, Error> {
            self.runtime
                .block_on(AsyncGuardedWrite::guarded_upsert(row, &mut self.conn))
        }
        fn upsert_each_in_transaction(
            &mut self,
            rows: Vec<T>,
        ) -> Result<Vec<Result<Upserted<TokenOf<T>>, Error>>, Error> {
            self.runtime
                .block_on(self.conn.transaction::<_, Error, _>(async move |conn| {
                    let mut answers = Vec::new();
                    for mut row in rows {
                        answers.push(AsyncGuardedWrite::guarded_upsert(&mut row, conn).await);
                    }
                    Ok(answers)
                }))
        }
    }

    impl<A, T: Guarded> Delete<T> for Async<A>
    where
        op::Delete<T>: AsyncRun<A>,
    {
        fn delete(&mut self, row: &T) -> Result<(), Error> {
            self.runtime
                .block_on(AsyncGuardedWrite::guarded_delete(row, &mut self.conn))
        }
    }

    impl<A, T: Guarded, Ch> BatchUpdate<T, Ch> for Async<A>
    where
        op::BatchUpdate<T, Ch>: AsyncRun<A>,
    {
        fn update_batch(
            &mut self,
            rows: Vec<(T::Key, TokenOf<T>, Ch)>,
            mode: BatchMode,
        ) -> Result<BatchReport<TokenOf<T>>, Error> {
            self.runtime
                .block_on(<T as AsyncGuardedBatch>::guarded_update_batch(
                    &mut self.conn,
                    rows,
                    mode,
                ))
        }
    }

    impl<A, T: Guarded> DeleteByKey<T> for Async<A>
    where
        op::Delete<T>: AsyncRun<A>,
    {
        fn delete_by_key(&mut self, key: &T::Key, expected: &TokenOf<T>) -> Result<(), Error> {
            self.runtime
                .block_on(<T as AsyncGuardedWrite>::guarded_delete_by_key(
                    &mut self.conn,
                    key,
                    expected,
                ))
        }
    }

    impl<A, T: Guarded> DeleteBatch<T> for Async<A>
    where
        op::BatchDelete<T>: AsyncRun<A>,
    {
        fn delete_batch(
            &mut self,
            rows: Vec<(T::Key, TokenOf<T>)>,
            mode: BatchMode,
        ) -> Result<BatchReport<()>, Error> {
            self.runtime
                .block_on(<T as AsyncGuardedBatch>::guarded_delete_batch(
                    &mut self.conn,
                    rows,
                    mode,
                ))
        }
    }

    impl<A, T> Touch<T> for Async<A>
    where
        T: Guarded<Guard: Advancing>,
        op::Update<T, NoChanges<<T as HasTable>::Table>>: AsyncRun<A>,
    {
        fn touch(&mut self, row: &mut T) -> Result<TokenOf<T>, Error> {
            self.runtime
                .block_on(AsyncGuardedWrite::guarded_touch(row, &mut self.conn))
        }
    }

    impl<A, T> Save<T> for Async<A>
    where
        T: Guarded<Guard: Advancing>,
        op::Update<T, T::Changes>: AsyncRun<A>,
    {
        fn save(&mut self, row: &mut T) -> Result<TokenOf<T>, Error> {
            self.runtime
                .block_on(AsyncGuardedWrite::guarded_save(row, &mut self.conn))
        }
    }

    impl<A, T: Guarded, Ch> Update<T, Ch> for Async<A>
    where
        op::Update<T, Ch>: AsyncRun<A>,
    {
        fn update(&mut self, row: &T, changes: Ch) -> Result<TokenOf<T>, Error> {
            self.runtime.block_on(AsyncGuardedWrite::guarded_update(
                row,
                &mut self.conn,
                changes,
            ))
        }
    }

    impl<A, T: Guarded, Ch> UpdateByKey<T, Ch> for Async<A>
    where
        op::Update<T, Ch>: AsyncRun<A>,
    {
        fn update_by_key(
            &mut self,
            key: &T::Key,
            expected: &TokenOf<T>,
            changes: Ch,
        ) -> Result<TokenOf<T>, Error> {
            self.runtime
                .block_on(<T as AsyncGuardedWrite>::guarded_update_by_key(
                    &mut self.conn,
                    key,
                    expected,
                    changes,
                ))
        }
    }

    impl<A, T: AsyncLoadByKey<A>> Read<T> for Async<A> {
        fn read(&mut self, key: &T::Key) -> Option<T> {
            self.runtime
                .block_on(T::read_by_key(&mut self.conn, key))
                .unwrap()
        }
    }

    impl<A, T, Ch> UpdateInTransaction<T, Ch> for Async<A>
    where
        A: AsyncConnection,
        T: Guarded,
        op::Update<T, Ch>: AsyncRun<A>,
        Ch: Send,
    {
        fn update_in_transaction(
            &mut self,
            row: &T,
            changes: Ch,
            commit: bool,
        ) -> (Result<TokenOf<T>, Error>, Result<(), Error>) {
            let mut answer = None;
            let answered = &mut answer;
            let outcome =
                self.runtime
                    .block_on(self.conn.transaction::<_, Error, _>(async move |conn| {
                        *answered =
                            Some(AsyncGuardedWrite::guarded_update(row, conn, changes).await);
                        if commit {
                            Ok(())
                        } else {
                            Err(rolled_back())
                        }
                    }));
            (answer.expect("the transaction ran"), outcome)
        }
    }

    impl<A, T, F, Ch> BulkUpdate<T, F, Ch> for Async<A>
    where
        T: Guarded<Guard: AdvanceInSql>,
        op::BulkUpdate<T, F, Ch>: AsyncRun<A>,
    {
        fn bulk_update(&mut self, filter: F, changes: Ch) -> Result<BulkReport, Error> {
            self.runtime
                .block_on(<T as AsyncGuardedBulk>::guarded_bulk_update(
                    &mut self.conn,
                    filter,
                    changes,
                ))
        }
    }

    impl<A, T, Col> EditJsonColumn<T, Col> for Async<A>
    where
        T: Guarded + Clone,
        Col: Column + 'static,
        op::JsonEdit<'static, T, Col, (), Error>: AsyncRun<A>,
    {
        fn merge_json(
            &mut self,
            key: &T::Key,
            column: Col,
            patch: &Value,
            policy: &RetryPolicy,
        ) -> Result<Modified<T, ()>, Error> {
            self.runtime.block_on(<T as AsyncGuardedJson>::merge_json(
                &mut self.conn,
                key,
                column,
                patch,
                policy,
            ))
        }
        fn patch_json(
            &mut self,
            key: &T::Key,
            column: Col,
            patch: &json_patch::Patch,
            policy: &RetryPolicy,
        ) -> Result<Modified<T, ()>, Error> {
            self.runtime.block_on(<T as AsyncGuardedJson>::patch_json(
                &mut self.conn,
                key,
                column,
                patch,
                policy,
            ))
        }
        fn set_json(
            &mut self,
            key: &T::Key,
            column: Col,
            pointer: &str,
            value: Value,
            policy: &RetryPolicy,
        ) -> Result<Modified<T, ()>, Error> {
            self.runtime.block_on(<T as AsyncGuardedJson>::set_json(
                &mut self.conn,
                key,
                column,
                pointer,
                value,
                policy,
            ))
        }
        fn remove_json(
            &mut self,
            key: &T::Key,
            column: Col,
            pointer: &str,
            policy: &RetryPolicy,
        ) -> Result<Modified<T, ()>, Error> {
            self.runtime.block_on(<T as AsyncGuardedJson>::remove_json(
                &mut self.conn,
                key,
                column,
                pointer,
                policy,
            ))
        }
        fn edit_json(
            &mut self,
            key: &T::Key,
            column: Col,
            policy: &RetryPolicy,
            edit: impl FnMut(&mut Value) -> Result<(), Error> + Send + 'static,
        ) -> Result<Modified<T, ()>, Error> {
            let edit: BoxedEdit<(), Error> = Box::new(edit);
            self.runtime.block_on(<T as AsyncGuardedJson>::edit_json(
                &mut self.conn,
                key,
                column,
                policy,
                edit,
            ))
        }
        fn update_json_as<D: Serialize + DeserializeOwned + 'static>(
            &mut self,
            key: &T::Key,
            column: Col,
            policy: &RetryPolicy,
            edit: impl FnMut(&mut D) -> Result<(), Error> + Send + 'static,
        ) -> Result<Modified<T, ()>, Error> {
            self.runtime
                .block_on(<T as AsyncGuardedJson>::update_json_as(
                    &mut self.conn,
                    key,
                    column,
                    policy,
                    edit,
                ))
        }
    }

    impl<A, T, Col> MergeJsonInPlace<T, Col> for Async<A>
    where
        T: Guarded<Guard: AdvanceInSql>,
        op::JsonMerge<T, Col>: AsyncRun<A>,
        op::JsonMergeNoToken<T, Col>: AsyncRun<A>,
    {
        fn merge_json_in_place(
            &mut self,
            key: &T::Key,
            column: Col,
            patch: &Value,
        ) -> Result<TokenOf<T>, Error> {
            self.runtime
                .block_on(<T as AsyncGuardedJson>::merge_json_in_place(
                    &mut self.conn,
                    key,
                    column,
                    patch,
                ))
        }
    }

    impl<A, T, R, E> Modify<T, R, E> for Async<A>
    where
        A: AsyncConnection,
        T: Guarded + Clone,
        R: Send,
        E: From<Error> + Send,
        op::Modify<T, Change<T, R, E>, R, E>: AsyncRun<A>,
    {
        fn modify(
            &mut self,
            key: &T::Key,
            policy: &RetryPolicy,
            change: impl FnMut(&mut T) -> Result<R, E> + Send + 'static,
        ) -> Result<Modified<T, R>, E> {
            let change: Change<T, R, E> = Box::new(change);
            self.runtime.block_on(<T as AsyncGuardedModify>::modify(
                &mut self.conn,
                key,
                policy,
                change,
            ))
        }
        fn modify_in_transaction(
            &mut self,
            key: &T::Key,
            policy: &RetryPolicy,
            change: impl FnMut(&mut T) -> Result<R, E> + Send + 'static,
        ) -> Result<Result<Modified<T, R>, E>, Error> {
            let change: Change<T, R, E> = Box::new(change);
            self.runtime
                .block_on(self.conn.transaction::<_, Error, _>(async move |conn| {
                    Ok(<T as AsyncGuardedModify>::modify(conn, key, policy, change).await)
                }))
        }
    }

    impl<P, T, R, E> ModifyPooled<T, R, E> for AsyncPool<P>
    where
        P: AsyncConnectionSource,
        T: Guarded + Clone,
        E: From<Error>,
        op::Modify<T, Change<T, R, E>, R, E>: AsyncRun<P::Connection>,
    {
        fn modify_pooled(
            &self,
            key: &T::Key,
            policy: &RetryPolicy,
            change: impl FnMut(&mut T) -> Result<R, E> + Send + 'static,
        ) -> Result<Modified<T, R>, E> {
            let change: Change<T, R, E> = Box::new(change);
            self.runtime
                .block_on(<T as AsyncGuardedModify>::modify_pooled(
                    &self.pool, key, policy, change,
                ))
        }
    }
}

/// Writes each test body once per driver, as `#[test]`s in modules `blocking` and (when
/// the async API is built) `on_async` of a `for_each_backend!` module; each gets a fresh
/// database, prepared by `$prepare(&db)`. A body listed first is
/// `fn(&TestDb, make_executor)` (a function that makes an executor on a connection of
/// its own, one per thread for the racing bodies); one listed after `pooled:` is
/// `fn(&TestDb, &pool_executor)` (the test's r2d2 pool, or a bb8 pool of 10 diesel-async
/// connections); one listed after `per_database:` is `fn(&TestDb, make_executor)` where
/// `make_executor(&db)` makes an executor on any database of the backend (a body that
/// makes a second one with `db()`). Attributes before a body's name (`#[cfg(...)]`) go to both of its tests.
#[macro_export]
macro_rules! tests_on_both_drivers {
    (
        $prepare:expr;
        $( $(#[$meta:meta])* $body:ident ),* $(,)?
        $( ; pooled: $( $(#[$pmeta:meta])* $pbody:ident ),* $(,)? )?
        $( ; per_database: $( $(#[$dmeta:meta])* $dbody:ident ),* $(,)? )?
    ) => {
        mod blocking {
            use super::*;
            $( $(#[$meta])* #[test] fn $body() {
                let Some(db) = db() else { return };
                ($prepare)(&db);
                let pool = &db.pool;
                super::$body(&db, || common::drivers::Blocking(pool.get().unwrap()));
            } )*
            $($( $(#[$pmeta])* #[test] fn $pbody() {
                let Some(db) = db() else { return };
                ($prepare)(&db);
                super::$pbody(&db, &common::drivers::BlockingPool(db.pool.clone()));
            } )*)?
            $($( $(#[$dmeta])* #[test] fn $dbody() {
                let Some(db) = db() else { return };
                ($prepare)(&db);
                super::$dbody(&db, |db: &Db| common::drivers::Blocking(db.pool.get().unwrap()));
            } )*)?
        }
        #[cfg(all(feature = "async", any(not(feature = "mysql"), feature = "async-mysql")))]
        mod on_async {
            use super::*;
            $( $(#[$meta])* #[test] fn $body() {
                use common::paths::AsyncOf;
                let Some(db) = db() else { return };
                ($prepare)(&db);
                let url = &db.url;
                super::$body(&db, || {
                    let runtime = common::paths::runtime();
                    common::drivers::Async { conn: Conn::connect(url, &runtime), runtime }
                });
            } )*
            $($( $(#[$pmeta])* #[cfg(feature = "bb8")] #[test] fn $pbody() {
                let Some(db) = db() else { return };
                ($prepare)(&db);
                let pool = common::drivers::AsyncPool::build(async {
                    diesel_async::pooled_connection::bb8::Pool::builder()
                        .max_size(10)
                        .build(common::drivers::manager::<<Conn as common::paths::AsyncOf>::Async>(&db.url, BACKEND))
                        .await
                        .expect("a bb8 pool")
                });
                super::$pbody(&db, &pool);
            } )*)?
            $($( $(#[$dmeta])* #[test] fn $dbody() {
                use common::paths::AsyncOf;
                let Some(db) = db() else { return };
                ($prepare)(&db);
                super::$dbody(&db, |db: &Db| {
                    let runtime = common::paths::runtime();
                    common::drivers::Async { conn: Conn::connect(&db.url, &runtime), runtime }
                });
            } )*)?
        }
    };
}

// Saves from an original copy and writes of excluded fields (added with the conversions
// of tests/writes/pre_image.rs and excluded_fields.rs).

/// A guarded save of a modified copy, guarded by the token its `original` was read with
/// (the library's `guarded_save_from`).
pub trait SaveFrom<T: Guarded> {
    fn save_from(&mut self, row: &mut T, original: &T) -> Result<TokenOf<T>, Error>;
}

/// Writes of excluded fields (`#[occ(exclude)]`), which neither check nor advance the
/// token: of a copy's row, and of the row with a key.
pub trait WriteExcluded<T: Guarded, Ch> {
    fn update_excluded(&mut self, row: &T, changes: Ch) -> Result<(), Error>;
    fn update_excluded_by_key(&mut self, key: &T::Key, changes: Ch) -> Result<(), Error>;
}

/// A changed-columns save (`guarded_save_changes_from`): the fields `row` changed since
/// `original`, written while the row still holds their old values.
pub trait SaveChangesFrom<T: Guarded> {
    fn save_changes_from(&mut self, row: &mut T, original: &T) -> Result<(), Error>;
}

impl<C, T> SaveChangesFrom<T> for Blocking<C>
where
    T: diesel_occ::SaveChanges<C>,
{
    fn save_changes_from(&mut self, row: &mut T, original: &T) -> Result<(), Error> {
        diesel_occ::GuardedChanges::guarded_save_changes_from(row, &mut self.0, original)
    }
}

impl<C, T> SaveFrom<T> for Blocking<C>
where
    T: UpdateRow<C, <T as Guarded>::Changes>,
{
    fn save_from(&mut self, row: &mut T, original: &T) -> Result<TokenOf<T>, Error> {
        row.guarded_save_from(&mut self.0, original)
    }
}

impl<C, T, Ch> WriteExcluded<T, Ch> for Blocking<C>
where
    T: diesel_occ::UpdateExcluded<C, Ch>,
{
    fn update_excluded(&mut self, row: &T, changes: Ch) -> Result<(), Error> {
        row.update_excluded(&mut self.0, changes)
    }
    fn update_excluded_by_key(&mut self, key: &T::Key, changes: Ch) -> Result<(), Error> {
        T::update_excluded_by_key(&mut self.0, key, changes)
    }
}

#[cfg(all(
    feature = "async",
    any(not(feature = "mysql"), feature = "async-mysql")
))]
mod on_async_saves_and_excluded {
    use super::*;

    use super::super::paths::Async;
    use diesel_occ::asynchronous::{AsyncGuardedWrite, AsyncRun};
    use diesel_occ::op;

    // The bounds are those of the `AsyncGuardedWrite` methods each call makes.
    impl<A, T> SaveFrom<T> for Async<A>
    where
        T: Guarded,
        op::Update<T, T::Changes>: AsyncRun<A>,
    {
        fn save_from(&mut self, row: &mut T, original: &T) -> Result<TokenOf<T>, Error> {
            self.runtime.block_on(AsyncGuardedWrite::guarded_save_from(
                row,
                &mut self.conn,
                original,
            ))
        }
    }

    impl<A, T> SaveChangesFrom<T> for Async<A>
    where
        T: diesel_occ::ChangedColumns,
        op::SaveChanged<T>: AsyncRun<A>,
    {
        fn save_changes_from(&mut self, row: &mut T, original: &T) -> Result<(), Error> {
            self.runtime
                .block_on(AsyncGuardedWrite::guarded_save_changes_from(
                    row,
                    &mut self.conn,
                    original,
                ))
        }
    }

    impl<A, T, Ch> WriteExcluded<T, Ch> for Async<A>
    where
        T: Guarded,
        op::WriteExcluded<T, Ch>: AsyncRun<A>,
    {
        fn update_excluded(&mut self, row: &T, changes: Ch) -> Result<(), Error> {
            self.runtime.block_on(AsyncGuardedWrite::update_excluded(
                row,
                &mut self.conn,
                changes,
            ))
        }
        fn update_excluded_by_key(&mut self, key: &T::Key, changes: Ch) -> Result<(), Error> {
            self.runtime
                .block_on(<T as AsyncGuardedWrite>::update_excluded_by_key(
                    &mut self.conn,
                    key,
                    changes,
                ))
        }
    }
}

// The caller's write transaction (`write_transaction`), added when the async API got one.

/// A write transaction of the caller's (`write_transaction`) around a plain read of the
/// row with `key` and a guarded update of it with `change(&row)`: the update's token; with
/// `then_fail`, the work answers `Error::Database(RollbackTransaction)` after the update,
/// and the transaction rolls back.
pub trait UpdateInWriteTransaction<T: Guarded, Ch> {
    fn update_in_write_transaction(
        &mut self,
        key: &T::Key,
        change: &(dyn Fn(&T) -> Ch + Sync),
        then_fail: bool,
    ) -> Result<TokenOf<T>, Error>;
}

impl<C, T, Ch> UpdateInWriteTransaction<T, Ch> for Blocking<C>
where
    C: WriteTransaction,
    T: UpdateRow<C, Ch>,
{
    fn update_in_write_transaction(
        &mut self,
        key: &T::Key,
        change: &(dyn Fn(&T) -> Ch + Sync),
        then_fail: bool,
    ) -> Result<TokenOf<T>, Error> {
        self.0.write_transaction(|conn| {
            let row = T::read_by_key(conn, key)?.expect("the row exists");
            let token = row.guarded_update(conn, change(&row))?;
            if then_fail {
                return Err(Error::Database(diesel::result::Error::RollbackTransaction));
            }
            Ok(token)
        })
    }
}

#[cfg(all(
    feature = "async",
    any(not(feature = "mysql"), feature = "async-mysql")
))]
impl<A, T, Ch> UpdateInWriteTransaction<T, Ch> for super::paths::Async<A>
where
    A: diesel_occ::asynchronous::AsyncWriteConnection + 'static,
    T: diesel_occ::asynchronous::AsyncLoadByKey<A> + Send,
    T::Key: Sync,
    diesel_occ::op::Update<T, Ch>: diesel_occ::asynchronous::AsyncRun<A>,
{
    fn update_in_write_transaction(
        &mut self,
        key: &T::Key,
        change: &(dyn Fn(&T) -> Ch + Sync),
        then_fail: bool,
    ) -> Result<TokenOf<T>, Error> {
        use diesel_occ::asynchronous::AsyncGuardedWrite;
        self.runtime
            .block_on(self.conn.write_transaction(async move |conn: &mut A| {
                let row = T::read_by_key(conn, key).await?.expect("the row exists");
                let token = AsyncGuardedWrite::guarded_update(&row, conn, change(&row)).await?;
                if then_fail {
                    return Err(Error::Database(diesel::result::Error::RollbackTransaction));
                }
                Ok(token)
            }))
    }
}

/// Raw SQL on the executor's connection: one statement as it is, or in a write
/// transaction of the caller's (`write_transaction`), committed unless it fails.
pub trait ExecuteSql {
    fn execute(&mut self, sql: &'static str) -> Result<(), Error>;
    fn execute_in_write_transaction(&mut self, sql: &'static str) -> Result<(), Error>;
}

impl<C> ExecuteSql for Blocking<C>
where
    C: WriteTransaction,
    diesel::query_builder::SqlQuery: diesel::query_dsl::methods::ExecuteDsl<C>,
{
    fn execute(&mut self, sql: &'static str) -> Result<(), Error> {
        diesel::RunQueryDsl::execute(diesel::sql_query(sql), &mut self.0)?;
        Ok(())
    }
    fn execute_in_write_transaction(&mut self, sql: &'static str) -> Result<(), Error> {
        self.0.write_transaction(|conn| {
            diesel::RunQueryDsl::execute(diesel::sql_query(sql), conn)?;
            Ok(())
        })
    }
}

#[cfg(all(
    feature = "async",
    any(not(feature = "mysql"), feature = "async-mysql")
))]
impl<A> ExecuteSql for super::paths::Async<A>
where
    A: diesel_occ::asynchronous::AsyncWriteConnection + 'static,
    diesel::query_builder::SqlQuery: diesel_async::methods::ExecuteDsl<A>,
{
    fn execute(&mut self, sql: &'static str) -> Result<(), Error> {
        let sent = diesel_async::RunQueryDsl::execute(diesel::sql_query(sql), &mut self.conn);
        self.runtime.block_on(sent)?;
        Ok(())
    }
    fn execute_in_write_transaction(&mut self, sql: &'static str) -> Result<(), Error> {
        self.runtime
            .block_on(self.conn.write_transaction(async move |conn: &mut A| {
                diesel_async::RunQueryDsl::execute(diesel::sql_query(sql), conn).await?;
                Ok::<_, Error>(())
            }))
    }
}

// Transactions of the caller's around any of the writes above, and the connection's
// instrumentation (added with the conversion of tests/writes/caller_transaction.rs).

/// A transaction of the caller's on the executor's connection, around any of its calls.
pub trait InTransaction: Sized {
    /// Opens a transaction (a savepoint inside one), runs `work` on this executor inside
    /// it, then commits when `work` answers `Ok` and rolls back otherwise: `work`'s
    /// answer, or the commit's failure.
    fn in_transaction<R>(
        &mut self,
        work: impl FnOnce(&mut Self) -> Result<R, Error>,
    ) -> Result<R, Error>;
}

/// The instrumentation of the executor's connection, which sees each statement and
/// transaction event of the calls made on it.
pub trait Instrument {
    fn set_instrumentation(&mut self, instrumentation: impl diesel::connection::Instrumentation);
}

impl<C: Connection> InTransaction for Blocking<C> {
    fn in_transaction<R>(
        &mut self,
        work: impl FnOnce(&mut Self) -> Result<R, Error>,
    ) -> Result<R, Error> {
        use diesel::connection::TransactionManager;
        C::TransactionManager::begin_transaction(&mut self.0)?;
        match work(self) {
            Ok(answer) => {
                C::TransactionManager::commit_transaction(&mut self.0)?;
                Ok(answer)
            }
            Err(error) => {
                C::TransactionManager::rollback_transaction(&mut self.0)?;
                Err(error)
            }
        }
    }
}

impl<C: Connection> Instrument for Blocking<C> {
    fn set_instrumentation(&mut self, instrumentation: impl diesel::connection::Instrumentation) {
        self.0.set_instrumentation(instrumentation)
    }
}

#[cfg(all(
    feature = "async",
    any(not(feature = "mysql"), feature = "async-mysql")
))]
mod on_async_transactions {
    use super::*;

    use super::super::paths::Async;
    use diesel_async::{AsyncConnection, TransactionManager};

    impl<A: AsyncConnection> InTransaction for Async<A> {
        fn in_transaction<R>(
            &mut self,
            work: impl FnOnce(&mut Self) -> Result<R, Error>,
        ) -> Result<R, Error> {
            self.runtime
                .block_on(A::TransactionManager::begin_transaction(&mut self.conn))?;
            match work(self) {
                Ok(answer) => {
                    self.runtime
                        .block_on(A::TransactionManager::commit_transaction(&mut self.conn))?;
                    Ok(answer)
                }
                Err(error) => {
                    self.runtime
                        .block_on(A::TransactionManager::rollback_transaction(&mut self.conn))?;
                    Err(error)
                }
            }
        }
    }

    impl<A: AsyncConnection> Instrument for Async<A> {
        fn set_instrumentation(
            &mut self,
            instrumentation: impl diesel::connection::Instrumentation,
        ) {
            self.conn.set_instrumentation(instrumentation)
        }
    }
}

// Status transitions, of a copy and by key, with or without a condition (added with the
// conversion of tests/status/transition.rs and transition_conditions.rs).

/// A guarded status transition of a loaded copy, with the extra assignments `Ch`.
pub trait Transition<T: diesel_occ::HasStatus, Ch> {
    fn transition(&mut self, row: &mut T, to: T::Status, extra: Ch) -> Result<TokenOf<T>, Error>;
}

/// A move of a loaded copy to any state, under its token (the library's `force_status`).
pub trait ForceStatus<T: diesel_occ::HasStatus, Ch> {
    fn force_status(&mut self, row: &mut T, to: T::Status, extra: Ch) -> Result<TokenOf<T>, Error>;
}

/// A guarded status transition of a loaded copy, only while the row meets `G`.
pub trait TransitionWhen<T: diesel_occ::HasStatus, Ch, G> {
    fn transition_when(
        &mut self,
        row: &mut T,
        to: T::Status,
        extra: Ch,
        condition: G,
    ) -> Result<TokenOf<T>, Error>;
}

/// A status transition by key, retried by `policy`.
pub trait TransitionKey<T: diesel_occ::HasStatus, Ch> {
    fn transition_by_key(
        &mut self,
        key: &T::Key,
        to: T::Status,
        extra: Ch,
        policy: &RetryPolicy,
    ) -> Result<TokenOf<T>, Error>;
}

/// A status transition by key, only while the row meets `G`, retried by `policy`.
pub trait TransitionKeyWhen<T: diesel_occ::HasStatus, Ch, G> {
    fn transition_by_key_when(
        &mut self,
        key: &T::Key,
        to: T::Status,
        extra: Ch,
        condition: G,
        policy: &RetryPolicy,
    ) -> Result<TokenOf<T>, Error>;
}

impl<C, T, Ch> Transition<T, Ch> for Blocking<C>
where
    T: diesel_occ::TransitionRow<C, Ch> + Clone,
{
    fn transition(&mut self, row: &mut T, to: T::Status, extra: Ch) -> Result<TokenOf<T>, Error> {
        diesel_occ::GuardedTransition::transition(row, &mut self.0, to, extra)
    }
}

impl<C, T, Ch> ForceStatus<T, Ch> for Blocking<C>
where
    T: diesel_occ::TransitionRow<C, Ch> + Clone,
{
    fn force_status(&mut self, row: &mut T, to: T::Status, extra: Ch) -> Result<TokenOf<T>, Error> {
        diesel_occ::GuardedTransition::force_status(row, &mut self.0, to, extra)
    }
}

impl<C, T, Ch, G> TransitionWhen<T, Ch, G> for Blocking<C>
where
    T: diesel_occ::TransitionRow<C, Ch, diesel_occ::When<G>> + Clone,
    G: diesel::AppearsOnTable<<T as HasTable>::Table>,
{
    fn transition_when(
        &mut self,
        row: &mut T,
        to: T::Status,
        extra: Ch,
        condition: G,
    ) -> Result<TokenOf<T>, Error> {
        diesel_occ::GuardedTransition::transition_when(row, &mut self.0, to, extra, condition)
    }
}

impl<C, T, Ch> TransitionKey<T, Ch> for Blocking<C>
where
    C: Connection,
    Ch: Clone,
    T: diesel_occ::TransitionByKey<C, Ch> + Clone,
    T::Guard: AdvanceInSql,
{
    fn transition_by_key(
        &mut self,
        key: &T::Key,
        to: T::Status,
        extra: Ch,
        policy: &RetryPolicy,
    ) -> Result<TokenOf<T>, Error> {
        <T as diesel_occ::GuardedStatusTransition>::transition_by_key(
            &mut self.0,
            key,
            to,
            extra,
            policy,
        )
    }
}

impl<C, T, Ch, G> TransitionKeyWhen<T, Ch, G> for Blocking<C>
where
    C: Connection,
    Ch: Clone,
    T: diesel_occ::TransitionByKey<C, Ch, diesel_occ::When<G>> + Clone,
    T::Guard: AdvanceInSql,
    G: diesel::AppearsOnTable<<T as HasTable>::Table> + Clone,
{
    fn transition_by_key_when(
        &mut self,
        key: &T::Key,
        to: T::Status,
        extra: Ch,
        condition: G,
        policy: &RetryPolicy,
    ) -> Result<TokenOf<T>, Error> {
        <T as diesel_occ::GuardedStatusTransition>::transition_by_key_when(
            &mut self.0,
            key,
            to,
            extra,
            condition,
            policy,
        )
    }
}

#[cfg(all(
    feature = "async",
    any(not(feature = "mysql"), feature = "async-mysql")
))]
mod on_async_transitions {
    use super::*;

    use super::super::paths::Async;
    use diesel_occ::asynchronous::{AsyncGuardedTransition, AsyncRun};
    use diesel_occ::op;
    use diesel_occ::HasStatus;
    use diesel_occ::When;

    // The bounds are those of the `AsyncGuardedTransition` methods each call makes.
    impl<A, T, Ch> Transition<T, Ch> for Async<A>
    where
        T: HasStatus + Clone,
        op::Transition<T, Ch>: AsyncRun<A>,
    {
        fn transition(
            &mut self,
            row: &mut T,
            to: T::Status,
            extra: Ch,
        ) -> Result<TokenOf<T>, Error> {
            self.runtime.block_on(AsyncGuardedTransition::transition(
                row,
                &mut self.conn,
                to,
                extra,
            ))
        }
    }

    impl<A, T, Ch> ForceStatus<T, Ch> for Async<A>
    where
        T: HasStatus + Clone,
        op::Transition<T, Ch>: AsyncRun<A>,
    {
        fn force_status(
            &mut self,
            row: &mut T,
            to: T::Status,
            extra: Ch,
        ) -> Result<TokenOf<T>, Error> {
            self.runtime.block_on(AsyncGuardedTransition::force_status(
                row,
                &mut self.conn,
                to,
                extra,
            ))
        }
    }

    impl<A, T, Ch, G> TransitionWhen<T, Ch, G> for Async<A>
    where
        T: HasStatus + Clone,
        op::Transition<T, Ch, When<G>>: AsyncRun<A>,
        G: diesel::AppearsOnTable<<T as HasTable>::Table>,
    {
        fn transition_when(
            &mut self,
            row: &mut T,
            to: T::Status,
            extra: Ch,
            condition: G,
        ) -> Result<TokenOf<T>, Error> {
            self.runtime
                .block_on(AsyncGuardedTransition::transition_when(
                    row,
                    &mut self.conn,
                    to,
                    extra,
                    condition,
                ))
        }
    }

    impl<A, T, Ch> TransitionKey<T, Ch> for Async<A>
    where
        T: HasStatus + Clone,
        op::KeyTransition<T, Ch>: AsyncRun<A>,
        T::Guard: AdvanceInSql,
    {
        fn transition_by_key(
            &mut self,
            key: &T::Key,
            to: T::Status,
            extra: Ch,
            policy: &RetryPolicy,
        ) -> Result<TokenOf<T>, Error> {
            self.runtime
                .block_on(<T as AsyncGuardedTransition>::transition_by_key(
                    &mut self.conn,
                    key,
                    to,
                    extra,
                    policy,
                ))
        }
    }

    impl<A, T, Ch, G> TransitionKeyWhen<T, Ch, G> for Async<A>
    where
        T: HasStatus + Clone,
        op::KeyTransition<T, Ch, When<G>>: AsyncRun<A>,
        T::Guard: AdvanceInSql,
        G: diesel::AppearsOnTable<<T as HasTable>::Table>,
    {
        fn transition_by_key_when(
            &mut self,
            key: &T::Key,
            to: T::Status,
            extra: Ch,
            condition: G,
            policy: &RetryPolicy,
        ) -> Result<TokenOf<T>, Error> {
            self.runtime
                .block_on(<T as AsyncGuardedTransition>::transition_by_key_when(
                    &mut self.conn,
                    key,
                    to,
                    extra,
                    condition,
                    policy,
                ))
        }
    }
}

// Locks on the executor's pool and the writes they protect (added with the conversion of
// tests/locks/held_lock.rs).

#[cfg(feature = "locks")]
#[allow(unused_imports)] // Unused in the test binaries without lock bodies.
pub use lock_writes::*;

#[cfg(feature = "locks")]
mod lock_writes {
    use super::*;

    use diesel::connection::SimpleConnection;
    use diesel::query_builder::SqlQuery;
    use diesel::query_dsl::methods::ExecuteDsl;
    use diesel_occ::{Held, Lease, LockConnection, LockGuard, Locks};
    use std::time::Duration;

    /// Locks `(name, resource)` taken with connections of the executor's pool (the
    /// library's `Locks`, or `AsyncLocks`), and writes they protect, each on a connection
    /// of the pool.
    pub trait LockWrites: Sync {
        /// A held lock.
        type Guard: Send;
        fn try_lock(
            &self,
            name: &str,
            resource: &str,
            ttl: Duration,
            label: Option<&str>,
        ) -> Result<Self::Guard, Error>;
        #[allow(clippy::too_many_arguments)]
        fn lock(
            &self,
            name: &str,
            resource: &str,
            ttl: Duration,
            label: Option<&str>,
            wait: Duration,
            policy: &RetryPolicy,
        ) -> Result<Self::Guard, Error>;
        fn fence(guard: &Self::Guard) -> i64;
        fn is_held(guard: &Self::Guard) -> bool;
        fn release(&self, guard: Self::Guard) -> Result<(), Error>;
        /// Drops the guard where its best-effort release can run.
        fn drop_guard(&self, guard: Self::Guard);
        /// Keeps `guard`'s lease alive, then releases it: the lease's handle, as it was.
        fn keep_alive_and_release(&self, guard: Self::Guard) -> Result<Held, Error>;
        /// Runs `sql` as a protected write (`write_while_held`): in a transaction that
        /// commits only while `guard` holds its lock by the database's clock. `session`
        /// runs before it on the same connection and `reset` after it ("" for none).
        /// With `fail`, the write answers its own error once `sql` ran
        /// (`Error::Database(RollbackTransaction)`), which must roll it back.
        fn write_while_held(
            &self,
            guard: &Self::Guard,
            session: &str,
            reset: &str,
            sql: &str,
            fail: bool,
        ) -> Result<usize, Error>;
        /// [`write_while_held`](Self::write_while_held) under a lease's handle.
        fn write_while_held_by(&self, held: &Held, sql: &str) -> Result<usize, Error>;
    }

    /// The protected write's closure: `sql`, then its own error with `fail`.
    fn protected<C>(conn: &mut C, sql: &str, fail: bool) -> Result<usize, Error>
    where
        SqlQuery: ExecuteDsl<C>,
        C: Connection,
    {
        let written = diesel::RunQueryDsl::execute(diesel::sql_query(sql), conn)?;
        if fail {
            Err(rolled_back())
        } else {
            Ok(written)
        }
    }

    impl<S> LockWrites for BlockingPool<S>
    where
        S: ConnectionSource + Sync,
        S::Connection: LockConnection + WriteTransaction,
        SqlQuery: ExecuteDsl<S::Connection>,
    {
        type Guard = LockGuard<S>;
        fn try_lock(
            &self,
            name: &str,
            resource: &str,
            ttl: Duration,
            label: Option<&str>,
        ) -> Result<Self::Guard, Error> {
            Locks::new(self.0.clone()).try_lock(name, resource, ttl, label)
        }
        fn lock(
            &self,
            name: &str,
            resource: &str,
            ttl: Duration,
            label: Option<&str>,
            wait: Duration,
            policy: &RetryPolicy,
        ) -> Result<Self::Guard, Error> {
            Locks::new(self.0.clone()).lock(name, resource, ttl, label, wait, policy)
        }
        fn fence(guard: &Self::Guard) -> i64 {
            guard.fence()
        }
        fn is_held(guard: &Self::Guard) -> bool {
            guard.is_held()
        }
        fn release(&self, guard: Self::Guard) -> Result<(), Error> {
            guard.release()
        }
        fn drop_guard(&self, guard: Self::Guard) {
            drop(guard)
        }
        fn keep_alive_and_release(&self, guard: Self::Guard) -> Result<Held, Error> {
            let lease = Lease::keep_alive(guard);
            let handle = lease.held().clone();
            lease.release()?;
            Ok(handle)
        }
        fn write_while_held(
            &self,
            guard: &Self::Guard,
            session: &str,
            reset: &str,
            sql: &str,
            fail: bool,
        ) -> Result<usize, Error> {
            self.0.on_connection(|conn| {
                if !session.is_empty() {
                    conn.batch_execute(session)?;
                }
                let written = guard.write_while_held(conn, |c| protected(c, sql, fail));
                if !reset.is_empty() {
                    conn.batch_execute(reset)?;
                }
                written
            })?
        }
        fn write_while_held_by(&self, held: &Held, sql: &str) -> Result<usize, Error> {
            self.0
                .on_connection(|conn| held.write_while_held(conn, |c| protected(c, sql, false)))?
        }
    }

    #[cfg(all(feature = "bb8", any(not(feature = "mysql"), feature = "async-mysql")))]
    mod on_async {
        use super::*;

        use diesel_async::SimpleAsyncConnection;
        use diesel_occ::asynchronous::{
            AsyncConnectionSource, AsyncLease, AsyncLockGuard, AsyncLocks,
        };

        /// The async protected write: `sql`, then its own error with `fail`.
        async fn protected_async<C>(conn: &mut C, sql: String, fail: bool) -> Result<usize, Error>
        where
            C: diesel_async::AsyncConnection,
            SqlQuery: diesel_async::methods::ExecuteDsl<C>,
        {
            let written = diesel_async::RunQueryDsl::execute(diesel::sql_query(sql), conn).await?;
            if fail {
                Err(rolled_back())
            } else {
                Ok(written)
            }
        }

        impl<P> LockWrites for AsyncPool<P>
        where
            P: AsyncConnectionSource,
            SqlQuery: diesel_async::methods::ExecuteDsl<P::Connection>,
        {
            type Guard = AsyncLockGuard<P>;
            fn try_lock(
                &self,
                name: &str,
                resource: &str,
                ttl: Duration,
                label: Option<&str>,
            ) -> Result<Self::Guard, Error> {
                let locks = AsyncLocks::new(self.pool.clone());
                self.runtime
                    .block_on(locks.try_lock(name, resource, ttl, label))
            }
            fn lock(
                &self,
                name: &str,
                resource: &str,
                ttl: Duration,
                label: Option<&str>,
                wait: Duration,
                policy: &RetryPolicy,
            ) -> Result<Self::Guard, Error> {
                let locks = AsyncLocks::new(self.pool.clone());
                self.runtime
                    .block_on(locks.lock(name, resource, ttl, label, wait, policy))
            }
            fn fence(guard: &Self::Guard) -> i64 {
                guard.fence()
            }
            fn is_held(guard: &Self::Guard) -> bool {
                guard.is_held()
            }
            fn release(&self, guard: Self::Guard) -> Result<(), Error> {
                self.runtime.block_on(guard.release())
            }
            fn drop_guard(&self, guard: Self::Guard) {
                let _runtime = self.runtime.enter();
                drop(guard)
            }
            fn keep_alive_and_release(&self, guard: Self::Guard) -> Result<Held, Error> {
                let _runtime = self.runtime.enter();
                let lease = AsyncLease::keep_alive(guard);
                let handle = lease.held().clone();
                self.runtime.block_on(lease.release())?;
                Ok(handle)
            }
            fn write_while_held(
                &self,
                guard: &Self::Guard,
                session: &str,
                reset: &str,
                sql: &str,
                fail: bool,
            ) -> Result<usize, Error> {
                let sql = sql.to_owned();
                self.runtime.block_on(async {
                    let mut conn = self.pool.checkout().await?;
                    let conn = &mut *conn;
                    if !session.is_empty() {
                        conn.batch_execute(session).await?;
                    }
                    let written = guard
                        .write_while_held(conn, async move |c: &mut P::Connection| {
                            protected_async(c, sql, fail).await
                        })
                        .await;
                    if !reset.is_empty() {
                        conn.batch_execute(reset).await?;
                    }
                    written
                })
            }
            fn write_while_held_by(&self, held: &Held, sql: &str) -> Result<usize, Error> {
                let sql = sql.to_owned();
                self.runtime.block_on(async {
                    let mut conn = self.pool.checkout().await?;
                    held.write_while_held_async(&mut *conn, async move |c: &mut P::Connection| {
                        protected_async(c, sql, false).await
                    })
                    .await
                })
            }
        }
    }
}

// Renewals of a held lock (added with the conversion of tests/locks/lock_stalls.rs).

#[cfg(feature = "locks")]
#[allow(unused_imports)] // Unused in the test binaries without lock bodies.
pub use lock_renewals::*;

#[cfg(feature = "locks")]
mod lock_renewals {
    use super::*;

    use diesel_occ::{LockConnection, LockGuard};
    use std::time::Instant;

    /// Renewals of a lock taken with [`LockWrites`].
    pub trait LockRenewals: LockWrites {
        /// Extends the lease to the guard's TTL from now (the database's clock).
        fn renew(&self, guard: &mut Self::Guard) -> Result<(), Error>;
        /// When the holder's belief ends, unless renewed.
        fn deadline(guard: &Self::Guard) -> Option<Instant>;
    }

    impl<S> LockRenewals for BlockingPool<S>
    where
        S: ConnectionSource + Sync,
        S::Connection: LockConnection + WriteTransaction,
        Self: LockWrites<Guard = LockGuard<S>>,
    {
        fn renew(&self, guard: &mut Self::Guard) -> Result<(), Error> {
            guard.renew()
        }
        fn deadline(guard: &Self::Guard) -> Option<Instant> {
            guard.deadline()
        }
    }

    #[cfg(all(feature = "bb8", any(not(feature = "mysql"), feature = "async-mysql")))]
    impl<P> LockRenewals for AsyncPool<P>
    where
        P: diesel_occ::asynchronous::AsyncConnectionSource,
        Self: LockWrites<Guard = diesel_occ::asynchronous::AsyncLockGuard<P>>,
    {
        fn renew(&self, guard: &mut Self::Guard) -> Result<(), Error> {
            self.runtime.block_on(guard.renew())
        }
        fn deadline(guard: &Self::Guard) -> Option<Instant> {
            guard.deadline()
        }
    }
}

// Kept-alive leases of a held lock (added with the conversion of
// tests/locks/lock_stalls.rs).

#[cfg(feature = "locks")]
#[allow(unused_imports)] // Unused in the test binaries without lock bodies.
pub use kept_alive::*;

#[cfg(feature = "locks")]
mod kept_alive {
    use super::*;

    use diesel_occ::{Lease, LockConnection, LockGuard};

    /// Leases that keep a lock taken with [`LockWrites`] alive (the library's `Lease`, or
    /// `AsyncLease`, renewing on a thread or a task of their own).
    pub trait KeepAlive: LockWrites {
        type Lease: Sync;
        fn keep_alive(&self, guard: Self::Guard) -> Self::Lease;
        /// `Ok` while the holder believes it holds the lock, else `LockLost`.
        fn lease_check(lease: &Self::Lease) -> Result<(), Error>;
        fn lease_is_held(lease: &Self::Lease) -> bool;
        fn lease_fence(lease: &Self::Lease) -> i64;
        /// Drops the lease where its best-effort release can run.
        fn drop_lease(&self, lease: Self::Lease);
    }

    impl<S> KeepAlive for BlockingPool<S>
    where
        S: ConnectionSource + Sync,
        S::Connection: LockConnection + WriteTransaction,
        Self: LockWrites<Guard = LockGuard<S>>,
    {
        type Lease = Lease<S>;
        fn keep_alive(&self, guard: Self::Guard) -> Self::Lease {
            Lease::keep_alive(guard)
        }
        fn lease_check(lease: &Self::Lease) -> Result<(), Error> {
            lease.check()
        }
        fn lease_is_held(lease: &Self::Lease) -> bool {
            lease.is_held()
        }
        fn lease_fence(lease: &Self::Lease) -> i64 {
            lease.fence()
        }
        fn drop_lease(&self, lease: Self::Lease) {
            drop(lease)
        }
    }

    #[cfg(all(feature = "bb8", any(not(feature = "mysql"), feature = "async-mysql")))]
    impl<P> KeepAlive for AsyncPool<P>
    where
        P: diesel_occ::asynchronous::AsyncConnectionSource,
        Self: LockWrites<Guard = diesel_occ::asynchronous::AsyncLockGuard<P>>,
        diesel_occ::asynchronous::AsyncLease<P>: Sync,
    {
        type Lease = diesel_occ::asynchronous::AsyncLease<P>;
        fn keep_alive(&self, guard: Self::Guard) -> Self::Lease {
            let _runtime = self.runtime.enter();
            diesel_occ::asynchronous::AsyncLease::keep_alive(guard)
        }
        fn lease_check(lease: &Self::Lease) -> Result<(), Error> {
            lease.check()
        }
        fn lease_is_held(lease: &Self::Lease) -> bool {
            lease.is_held()
        }
        fn lease_fence(lease: &Self::Lease) -> i64 {
            lease.fence()
        }
        fn drop_lease(&self, lease: Self::Lease) {
            let _runtime = self.runtime.enter();
            drop(lease)
        }
    }
}

// Leader election on a lock taken with the executor's pool (added with the conversion of
// tests/locks/lock_stalls.rs).

#[cfg(feature = "locks")]
#[allow(unused_imports)] // Unused in the test binaries without lock bodies.
pub use campaigns::*;

#[cfg(feature = "locks")]
mod campaigns {
    use super::*;

    use diesel_occ::{Candidate, ElectionTiming, LeaderEvent, LockConnection, LockGuard, Locks};
    use std::time::Duration;

    /// Candidates for leadership of a lock of the executor's pool (the library's
    /// `Candidate`, or `AsyncCandidate`).
    pub trait Campaign: LockWrites {
        type Candidate;
        fn start_candidate(
            &self,
            name: &str,
            resource: &str,
            label: &str,
            timing: ElectionTiming,
        ) -> Result<Self::Candidate, Error>;
        fn is_leader(candidate: &Self::Candidate) -> bool;
        /// The candidate's next event, waiting at most `within` (`Duration::ZERO`: only
        /// one already there).
        fn next_event(
            &self,
            candidate: &mut Self::Candidate,
            within: Duration,
        ) -> Option<LeaderEvent>;
        /// Stops campaigning (stepping down if it leads): the events not yet taken.
        fn stop(&self, candidate: Self::Candidate) -> Vec<LeaderEvent>;
    }

    impl<S> Campaign for BlockingPool<S>
    where
        S: ConnectionSource + Sync,
        S::Connection: LockConnection + WriteTransaction,
        Self: LockWrites<Guard = LockGuard<S>>,
    {
        type Candidate = Candidate;
        fn start_candidate(
            &self,
            name: &str,
            resource: &str,
            label: &str,
            timing: ElectionTiming,
        ) -> Result<Self::Candidate, Error> {
            Candidate::start(Locks::new(self.0.clone()), name, resource, label, timing)
        }
        fn is_leader(candidate: &Self::Candidate) -> bool {
            candidate.is_leader()
        }
        fn next_event(
            &self,
            candidate: &mut Self::Candidate,
            within: Duration,
        ) -> Option<LeaderEvent> {
            candidate.events().recv_timeout(within).ok()
        }
        fn stop(&self, candidate: Self::Candidate) -> Vec<LeaderEvent> {
            candidate.stop()
        }
    }

    #[cfg(all(feature = "bb8", any(not(feature = "mysql"), feature = "async-mysql")))]
    impl<P> Campaign for AsyncPool<P>
    where
        P: diesel_occ::asynchronous::AsyncConnectionSource,
        Self: LockWrites<Guard = diesel_occ::asynchronous::AsyncLockGuard<P>>,
    {
        type Candidate = diesel_occ::asynchronous::AsyncCandidate;
        fn start_candidate(
            &self,
            name: &str,
            resource: &str,
            label: &str,
            timing: ElectionTiming,
        ) -> Result<Self::Candidate, Error> {
            let _runtime = self.runtime.enter();
            let locks = diesel_occ::asynchronous::AsyncLocks::new(self.pool.clone());
            diesel_occ::asynchronous::AsyncCandidate::start(locks, name, resource, label, timing)
        }
        fn is_leader(candidate: &Self::Candidate) -> bool {
            candidate.is_leader()
        }
        fn next_event(
            &self,
            candidate: &mut Self::Candidate,
            within: Duration,
        ) -> Option<LeaderEvent> {
            // The event channel's `recv` is cancel-safe, and the timeout polls it first.
            self.runtime
                .block_on(async { tokio::time::timeout(within, candidate.next_event()).await })
                .ok()
                .flatten()
        }
        fn stop(&self, candidate: Self::Candidate) -> Vec<LeaderEvent> {
            self.runtime.block_on(candidate.stop())
        }
    }
}

// Leaders with a job (added with the conversion of tests/locks/held_lock.rs).

#[cfg(feature = "locks")]
#[allow(unused_imports)] // Unused in the test binaries without lock bodies.
pub use campaigns_with_jobs::*;

#[cfg(feature = "locks")]
mod campaigns_with_jobs {
    use super::*;

    use diesel_occ::{Candidate, ElectionTiming, Held, LockConnection, LockGuard, Locks};
    use std::sync::Arc;

    /// A leader's job that only runs `work` (which may panic), the same on both drivers:
    /// the blocking job calls it, the async job's future does.
    pub type JobWork = Arc<dyn Fn() + Send + Sync>;

    /// Candidates that run a job while they lead.
    pub trait CampaignWithJob: Campaign {
        fn start_candidate_with_job(
            &self,
            name: &str,
            resource: &str,
            label: &str,
            timing: ElectionTiming,
            work: JobWork,
        ) -> Result<Self::Candidate, Error>;
    }

    impl<S> CampaignWithJob for BlockingPool<S>
    where
        S: ConnectionSource + Sync,
        S::Connection: LockConnection + WriteTransaction,
        Self: LockWrites<Guard = LockGuard<S>> + Campaign<Candidate = Candidate>,
    {
        fn start_candidate_with_job(
            &self,
            name: &str,
            resource: &str,
            label: &str,
            timing: ElectionTiming,
            work: JobWork,
        ) -> Result<Self::Candidate, Error> {
            let locks = Locks::new(self.0.clone());
            Candidate::start_with_job(locks, name, resource, label, timing, move |_: &Held| work())
        }
    }

    #[cfg(all(feature = "bb8", any(not(feature = "mysql"), feature = "async-mysql")))]
    impl<P> CampaignWithJob for AsyncPool<P>
    where
        P: diesel_occ::asynchronous::AsyncConnectionSource,
        Self: LockWrites<Guard = diesel_occ::asynchronous::AsyncLockGuard<P>>
            + Campaign<Candidate = diesel_occ::asynchronous::AsyncCandidate>,
    {
        fn start_candidate_with_job(
            &self,
            name: &str,
            resource: &str,
            label: &str,
            timing: ElectionTiming,
            work: JobWork,
        ) -> Result<Self::Candidate, Error> {
            let _runtime = self.runtime.enter();
            let locks = diesel_occ::asynchronous::AsyncLocks::new(self.pool.clone());
            diesel_occ::asynchronous::AsyncCandidate::start_with_job(
                locks,
                name,
                resource,
                label,
                timing,
                move |_: Held| {
                    let work = Arc::clone(&work);
                    async move { work() }
                },
            )
        }
    }
}

// Another pool of the same kind on another URL (added with the conversion of
// tests/locks/lock_stalls.rs).

/// A pool executor like this one on `url` (say, through a proxy to the same database).
pub trait PoolOnUrl: Sized {
    fn on_url(&self, url: &str, backend: &str) -> Self;
}

impl<C: super::PoolByUrl> PoolOnUrl
    for BlockingPool<diesel::r2d2::Pool<diesel_occ::CheckedManager<C>>>
{
    fn on_url(&self, url: &str, _backend: &str) -> Self {
        BlockingPool(C::pool(url))
    }
}

/// [`PoolOnUrl`] for bb8 pools of the diesel-async connection `$async`.
#[cfg(all(feature = "bb8", any(not(feature = "mysql"), feature = "async-mysql")))]
macro_rules! bb8_pool_on_url {
    ($async:ty) => {
        impl PoolOnUrl for AsyncPool<diesel_async::pooled_connection::bb8::Pool<$async>> {
            fn on_url(&self, url: &str, backend: &str) -> Self {
                let manager = manager::<$async>(url, backend);
                AsyncPool::build(async move {
                    diesel_async::pooled_connection::bb8::Pool::builder()
                        .max_size(10)
                        .build(manager)
                        .await
                        .expect("a bb8 pool")
                })
            }
        }
    };
}

#[cfg(all(
    feature = "bb8",
    feature = "sqlite",
    any(not(feature = "mysql"), feature = "async-mysql")
))]
bb8_pool_on_url!(
    diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>
);
#[cfg(all(
    feature = "bb8",
    feature = "postgres",
    any(not(feature = "mysql"), feature = "async-mysql")
))]
bb8_pool_on_url!(diesel_async::AsyncPgConnection);
#[cfg(all(feature = "bb8", feature = "async-mysql"))]
bb8_pool_on_url!(diesel_async::AsyncMysqlConnection);

// Lock holders' names and fenced writes on a connection of the executor's pool (added
// with the conversion of tests/locks/lock.rs).

#[cfg(feature = "locks")]
#[allow(unused_imports)] // Unused in the test binaries without lock bodies.
pub use lock_holders::*;

#[cfg(feature = "locks")]
mod lock_holders {
    use super::*;

    use diesel_occ::{FencedWrite, LockConnection, LockGuard, WriteFenced};

    /// Who holds a lock taken with [`LockWrites`], as its lock row names the holder.
    pub trait LockHolder: LockWrites {
        fn holder(guard: &Self::Guard) -> String;
    }

    /// A fenced write (`write_fenced`) of `changes` to the row of `T` with `key`, on a
    /// connection of the executor's pool.
    pub trait WriteFencedPooled<T: Guarded, F, Ch> {
        fn write_fenced(
            &self,
            key: &T::Key,
            fence_column: F,
            fence: i64,
            changes: Ch,
        ) -> Result<(), Error>;
    }

    impl<S> LockHolder for BlockingPool<S>
    where
        S: ConnectionSource + Sync,
        S::Connection: LockConnection + WriteTransaction,
        Self: LockWrites<Guard = LockGuard<S>>,
    {
        fn holder(guard: &Self::Guard) -> String {
            guard.holder().to_owned()
        }
    }

    impl<S, T, F, Ch> WriteFencedPooled<T, F, Ch> for BlockingPool<S>
    where
        S: ConnectionSource,
        T: WriteFenced<S::Connection, F, Ch>,
    {
        fn write_fenced(
            &self,
            key: &T::Key,
            fence_column: F,
            fence: i64,
            changes: Ch,
        ) -> Result<(), Error> {
            self.0.on_connection(|conn| {
                <T as FencedWrite>::write_fenced(conn, key, fence_column, fence, changes)
            })?
        }
    }

    #[cfg(all(feature = "bb8", any(not(feature = "mysql"), feature = "async-mysql")))]
    mod on_async {
        use super::*;

        use diesel_occ::asynchronous::{
            AsyncConnectionSource, AsyncFencedWrite, AsyncLockGuard, AsyncRun,
        };

        impl<P> LockHolder for AsyncPool<P>
        where
            P: AsyncConnectionSource,
            Self: LockWrites<Guard = AsyncLockGuard<P>>,
        {
            fn holder(guard: &Self::Guard) -> String {
                guard.holder().to_owned()
            }
        }

        impl<P, T, F, Ch> WriteFencedPooled<T, F, Ch> for AsyncPool<P>
        where
            P: AsyncConnectionSource,
            T: Guarded,
            diesel_occ::op::FencedUpdate<T, F, Ch>: AsyncRun<P::Connection>,
        {
            fn write_fenced(
                &self,
                key: &T::Key,
                fence_column: F,
                fence: i64,
                changes: Ch,
            ) -> Result<(), Error> {
                self.runtime.block_on(async {
                    let mut conn = self.pool.checkout().await?;
                    <T as AsyncFencedWrite>::write_fenced(
                        &mut *conn,
                        key,
                        fence_column,
                        fence,
                        changes,
                    )
                    .await
                })
            }
        }
    }
}

// Releases of kept-alive leases (added with the conversion of tests/locks/leader.rs).

#[cfg(feature = "locks")]
#[allow(unused_imports)] // Unused in the test binaries without lock bodies.
pub use lease_releases::*;

#[cfg(feature = "locks")]
mod lease_releases {
    use super::*;

    use diesel_occ::{Lease, LockConnection};

    /// The owner-checked release of a lease kept alive with [`KeepAlive`].
    pub trait ReleaseLease: KeepAlive {
        fn release_lease(&self, lease: Self::Lease) -> Result<(), Error>;
    }

    impl<S> ReleaseLease for BlockingPool<S>
    where
        S: ConnectionSource + Sync,
        S::Connection: LockConnection + WriteTransaction,
        Self: KeepAlive<Lease = Lease<S>>,
    {
        fn release_lease(&self, lease: Self::Lease) -> Result<(), Error> {
            lease.release()
        }
    }

    #[cfg(all(feature = "bb8", any(not(feature = "mysql"), feature = "async-mysql")))]
    impl<P> ReleaseLease for AsyncPool<P>
    where
        P: diesel_occ::asynchronous::AsyncConnectionSource,
        Self: KeepAlive<Lease = diesel_occ::asynchronous::AsyncLease<P>>,
    {
        fn release_lease(&self, lease: Self::Lease) -> Result<(), Error> {
            self.runtime.block_on(lease.release())
        }
    }
}

/// A pool executor of `size` bb8-pooled diesel-async connections `A` to `url` (for a
/// child process, which must reach its parent's database), on a runtime of its own.
#[cfg(all(feature = "bb8", any(not(feature = "mysql"), feature = "async-mysql")))]
pub fn bb8_pool_on<A>(
    url: &str,
    backend: &str,
    size: u32,
) -> AsyncPool<diesel_async::pooled_connection::bb8::Pool<A>>
where
    A: diesel_async::pooled_connection::PoolableConnection + 'static,
    for<'a> diesel::dsl::select<diesel::dsl::AsExprOf<i32, diesel::sql_types::Integer>>:
        diesel_async::methods::LoadQuery<'a, A, i32>,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<A::Backend>,
{
    let manager = manager::<A>(url, backend);
    AsyncPool::build(async move {
        diesel_async::pooled_connection::bb8::Pool::builder()
            .max_size(size)
            .build(manager)
            .await
            .expect("a bb8 pool")
    })
}

// Leadership watches (added with the conversion of tests/locks/leader.rs).

#[cfg(all(feature = "locks", feature = "tokio"))]
#[allow(unused_imports)] // Unused in the test binaries without lock bodies.
pub use leadership_watches::*;

#[cfg(all(feature = "locks", feature = "tokio"))]
mod leadership_watches {
    use super::*;

    use diesel_occ::{Candidate, Leadership, LockConnection, LockGuard};

    /// The leadership of a candidate started with [`Campaign`], as the `watch` channel
    /// async code awaits (the library's `leadership`, on both candidates).
    pub trait WatchLeadership: Campaign {
        fn leadership(candidate: &Self::Candidate) -> tokio::sync::watch::Receiver<Leadership>;
    }

    impl<S> WatchLeadership for BlockingPool<S>
    where
        S: ConnectionSource + Sync,
        S::Connection: LockConnection + WriteTransaction,
        Self: LockWrites<Guard = LockGuard<S>> + Campaign<Candidate = Candidate>,
    {
        fn leadership(candidate: &Self::Candidate) -> tokio::sync::watch::Receiver<Leadership> {
            candidate.leadership()
        }
    }

    #[cfg(all(feature = "bb8", any(not(feature = "mysql"), feature = "async-mysql")))]
    impl<P> WatchLeadership for AsyncPool<P>
    where
        P: diesel_occ::asynchronous::AsyncConnectionSource,
        Self: Campaign<Candidate = diesel_occ::asynchronous::AsyncCandidate>,
    {
        fn leadership(candidate: &Self::Candidate) -> tokio::sync::watch::Receiver<Leadership> {
            candidate.leadership()
        }
    }
}

/// The load of a row by key that a handler makes: the row, or `NotFound` naming the table
/// and key (the library's `find_by_key`).
pub trait Find<T: Guarded> {
    fn find(&mut self, key: &T::Key) -> Result<T, Error>;
}

/// JSON edits pinned to a request's `If-Match` (the library's `*_json_if_match`).
#[cfg(feature = "http")]
pub trait EditJsonIfMatch<T: Guarded, Col> {
    fn merge_json_if_match(
        &mut self,
        key: &T::Key,
        column: Col,
        patch: &Value,
        if_match: &diesel_occ::http::Precondition,
        policy: &RetryPolicy,
    ) -> Result<Modified<T, ()>, Error>;
    fn patch_json_if_match(
        &mut self,
        key: &T::Key,
        column: Col,
        patch: &json_patch::Patch,
        if_match: &diesel_occ::http::Precondition,
        policy: &RetryPolicy,
    ) -> Result<Modified<T, ()>, Error>;
}

impl<C: LoadConnection, T: LoadByKey<C>> Find<T> for Blocking<C>
where
    C::Backend: OccBackend,
{
    fn find(&mut self, key: &T::Key) -> Result<T, Error> {
        T::find_by_key(&mut self.0, key)
    }
}

#[cfg(feature = "http")]
impl<C, T, Col> EditJsonIfMatch<T, Col> for Blocking<C>
where
    T: Guarded + EditJson<C, Col>,
    Col: Column,
{
    fn merge_json_if_match(
        &mut self,
        key: &T::Key,
        column: Col,
        patch: &Value,
        if_match: &diesel_occ::http::Precondition,
        policy: &RetryPolicy,
    ) -> Result<Modified<T, ()>, Error> {
        T::merge_json_if_match(&mut self.0, key, column, patch, if_match, policy)
    }
    fn patch_json_if_match(
        &mut self,
        key: &T::Key,
        column: Col,
        patch: &json_patch::Patch,
        if_match: &diesel_occ::http::Precondition,
        policy: &RetryPolicy,
    ) -> Result<Modified<T, ()>, Error> {
        T::patch_json_if_match(&mut self.0, key, column, patch, if_match, policy)
    }
}

#[cfg(all(
    feature = "async",
    any(not(feature = "mysql"), feature = "async-mysql")
))]
mod on_async_web {
    use super::*;

    use super::super::paths::Async;
    use diesel_async::AsyncConnection;
    use diesel_occ::asynchronous::AsyncLoadByKey;

    impl<A, T> Find<T> for Async<A>
    where
        A: AsyncConnection,
        A::Backend: OccBackend,
        T: AsyncLoadByKey<A>,
    {
        fn find(&mut self, key: &T::Key) -> Result<T, Error> {
            self.runtime.block_on(T::find_by_key(&mut self.conn, key))
        }
    }

    #[cfg(feature = "http")]
    impl<A, T, Col> EditJsonIfMatch<T, Col> for Async<A>
    where
        T: Guarded + Clone,
        Col: Column + 'static,
        diesel_occ::op::JsonEdit<'static, T, Col, (), Error>: diesel_occ::asynchronous::AsyncRun<A>,
    {
        fn merge_json_if_match(
            &mut self,
            key: &T::Key,
            column: Col,
            patch: &Value,
            if_match: &diesel_occ::http::Precondition,
            policy: &RetryPolicy,
        ) -> Result<Modified<T, ()>, Error> {
            use diesel_occ::asynchronous::AsyncGuardedJson;
            self.runtime
                .block_on(<T as AsyncGuardedJson>::merge_json_if_match(
                    &mut self.conn,
                    key,
                    column,
                    patch,
                    if_match,
                    policy,
                ))
        }
        fn patch_json_if_match(
            &mut self,
            key: &T::Key,
            column: Col,
            patch: &json_patch::Patch,
            if_match: &diesel_occ::http::Precondition,
            policy: &RetryPolicy,
        ) -> Result<Modified<T, ()>, Error> {
            use diesel_occ::asynchronous::AsyncGuardedJson;
            self.runtime
                .block_on(<T as AsyncGuardedJson>::patch_json_if_match(
                    &mut self.conn,
                    key,
                    column,
                    patch,
                    if_match,
                    policy,
                ))
        }
    }
}
