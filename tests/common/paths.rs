//! One test body, two executors: the blocking API on a pooled connection, and the async
//! API (feature `async`) on a diesel-async connection to the same database, driven from
//! the test's thread. Test bodies take a [`Writes`] and run unchanged on both.

use diesel::prelude::*;
use diesel_occ::asynchronous::prelude::*;
use diesel_occ::{
    BulkReport, Error, GuardedBulk, GuardedModify, GuardedWrite, Modified, RetryPolicy, Upserted,
};
use std::sync::{Arc, Mutex};

use super::models::{Order, OrderPatch, OrderState, TrackedOrder, ViewedOrder};
use super::schema::orders;
use diesel_occ::{
    no_extra, GuardedStatusTransition, GuardedTransition, HistoryEntry, LockWait, Pessimistic,
    Status,
};

/// The writes of the shared test bodies, on the `orders` table's [`Order`].
pub trait Writes {
    /// Which executor, for messages.
    const PATH: &'static str;
    fn update(&mut self, row: &Order, patch: OrderPatch) -> Result<i64, Error>;
    fn update_by_key(&mut self, id: i64, expected: i64, patch: OrderPatch) -> Result<i64, Error>;
    fn save(&mut self, row: &mut Order) -> Result<i64, Error>;
    fn save_from(&mut self, row: &mut Order, original: &Order) -> Result<i64, Error>;
    fn touch(&mut self, row: &mut Order) -> Result<i64, Error>;
    fn delete(&mut self, row: &Order) -> Result<(), Error>;
    fn delete_by_key(&mut self, id: i64, expected: i64) -> Result<(), Error>;
    /// Appends `suffix` to the note and adds one to the quantity, retried by `policy`.
    fn add_one(
        &mut self,
        id: i64,
        suffix: &'static str,
        policy: &RetryPolicy,
    ) -> Result<Modified<Order, ()>, Error>;
    /// The row as committed, read on this executor's connection.
    fn load(&mut self, id: i64) -> Option<Order>;
    /// The row as committed, as a [`TrackedOrder`].
    fn load_tracked(&mut self, id: i64) -> Option<TrackedOrder>;
    /// Moves a loaded copy to `to`.
    fn transition(&mut self, row: &mut TrackedOrder, to: OrderState) -> Result<i64, Error>;
    /// Moves a loaded copy to `to` while its quantity is above `min`.
    fn transition_if_more_than(
        &mut self,
        row: &mut TrackedOrder,
        to: OrderState,
        min: i32,
    ) -> Result<i64, Error>;
    /// Sets the view counter of the row with `id`, outside the guard.
    fn set_views(&mut self, id: i64, views: i64) -> Result<(), Error>;
    /// Writes the note through `update_excluded`, which must refuse it.
    fn note_as_excluded(&mut self, id: i64) -> Result<(), Error>;
    /// Inserts a copy as a new row with a seeded token.
    fn insert(&mut self, row: &mut Order) -> Result<i64, Error>;
    /// Saves a copy over its row, or inserts it.
    fn upsert(&mut self, row: &mut Order) -> Result<Upserted<i64>, Error>;
    /// Moves the row with `id` to `to`, whatever its token.
    fn transition_by_key(&mut self, id: i64, to: OrderState) -> Result<i64, Error>;
    /// Sets the note of every order whose quantity is at least `min`, advancing each
    /// changed row's version.
    fn bulk_note(&mut self, min: i32, note: &'static str) -> Result<BulkReport, Error>;
    /// Moves a loaded copy to `to` with a hook that records the move in the history
    /// (actor `by`) and then fails when `fail`.
    fn transition_recorded(
        &mut self,
        row: &mut TrackedOrder,
        to: OrderState,
        by: &'static str,
        fail: bool,
    ) -> Result<i64, HookError>;
    /// Moves the row with `id` to `to` with the same hook; the row as moved.
    fn transition_by_key_recorded(
        &mut self,
        id: i64,
        to: OrderState,
        by: &'static str,
        fail: bool,
    ) -> Result<TrackedOrder, HookError>;
    /// Adds `n` to the quantity of the row with `id`, locked, by an unguarded
    /// read-then-write; the quantity written.
    fn add_locked(&mut self, id: i64, n: i32, wait: LockWait) -> Result<i32, Error>;
    /// Sets the note of `copy`'s row, locked, if the row still holds the copy's token; the
    /// row as it was locked.
    fn note_if_current(&mut self, copy: &Order, note: &'static str) -> Result<Order, Error>;
    /// The transition history: key, from, to, actor, in order.
    fn history(&mut self) -> Vec<(String, String, String, Option<String>)>;
    /// Records the text of every statement this executor's connection sends from now on.
    fn record_statements(&mut self) -> Arc<Mutex<Vec<String>>>;
    /// Runs `sql` (no bind values) on this executor's connection.
    fn execute(&mut self, sql: &str);
}

/// An instrumentation that keeps the text of every statement a connection sends.
pub fn recorder(statements: &Arc<Mutex<Vec<String>>>) -> impl diesel::connection::Instrumentation {
    let statements = Arc::clone(statements);
    move |event: diesel::connection::InstrumentationEvent<'_>| {
        if let diesel::connection::InstrumentationEvent::StartQuery { query, .. } = event {
            statements.lock().unwrap().push(query.to_string());
        }
    }
}

/// Keeps the text of every statement a connection prepares and keeps for reuse.
pub fn cache_recorder(
    statements: &Arc<Mutex<Vec<String>>>,
) -> impl diesel::connection::Instrumentation {
    let statements = Arc::clone(statements);
    move |event: diesel::connection::InstrumentationEvent<'_>| {
        if let diesel::connection::InstrumentationEvent::CacheQuery { sql, .. } = event {
            statements.lock().unwrap().push(sql.to_string());
        }
    }
}

/// A row of the transition history, as [`Writes::history`] reads it.
#[derive(diesel::QueryableByName)]
pub struct HistoryRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    entity_key: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    from_status: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    to_status: String,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    actor: Option<String>,
}

/// The read of [`Writes::history`].
fn history_query() -> diesel::query_builder::SqlQuery {
    diesel::sql_query(
        "SELECT entity_key, from_status, to_status, actor FROM occ_transitions ORDER BY id",
    )
}

fn history_rows(rows: Vec<HistoryRow>) -> Vec<(String, String, String, Option<String>)> {
    rows.into_iter()
        .map(|r| (r.entity_key, r.from_status, r.to_status, r.actor))
        .collect()
}

/// A transition hook's own failure, or the library's.
#[derive(Debug)]
pub enum HookError {
    Occ(Error),
    LabelPrinterDown,
}

impl From<Error> for HookError {
    fn from(error: Error) -> Self {
        HookError::Occ(error)
    }
}

/// The history entry of a recorded move of `row` from `from`, by `by`.
fn entry<'a>(key: &'a str, from: OrderState, row: &TrackedOrder, by: &'a str) -> HistoryEntry<'a> {
    HistoryEntry {
        entity: "orders",
        key,
        from: from.name(),
        to: row.status.name(),
        actor: Some(by),
    }
}

/// What a recorded move's hook returns after the history row is written.
fn hook_outcome(fail: bool) -> Result<(), HookError> {
    if fail {
        Err(HookError::LabelPrinterDown)
    } else {
        Ok(())
    }
}

/// The change of [`Writes::add_one`].
pub fn add_one_to(order: &mut Order, suffix: &str) -> Result<(), Error> {
    order.note.push_str(suffix);
    order.quantity += 1;
    Ok(())
}

/// The blocking API on connection `C` (with the drivers' traits, in [`super::drivers`]).
pub use super::drivers::Blocking;

/// The async API on diesel-async connection `A`, driven by a runtime of the test thread's.
pub struct Async<A> {
    pub conn: A,
    pub runtime: tokio::runtime::Runtime,
}

/// A runtime for one test thread: the driven futures run on it, and on SQLite the
/// connection's thread is one of its blocking threads. Multi-threaded, as diesel-async's
/// SQLite connection needs to wait for a dropped call's thread (`block_in_place`). Its
/// threads share the building thread's [`FrozenClock`](super::FrozenClock).
pub fn runtime() -> tokio::runtime::Runtime {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.worker_threads(1).enable_all();
    #[cfg(feature = "chrono")]
    {
        let clock = super::FrozenClock::of_this_thread();
        builder.on_thread_start(move || super::FrozenClock::share(clock.clone()));
    }
    builder.build().expect("a test runtime")
}

/// The diesel-async connection of a blocking connection type's backend.
pub trait AsyncOf {
    type Async: diesel_async::AsyncConnection + Send + 'static;
    /// A connection to `url`, made on `runtime`.
    fn connect(url: &str, runtime: &tokio::runtime::Runtime) -> Self::Async;
}

#[cfg(feature = "sqlite")]
impl AsyncOf for diesel::SqliteConnection {
    type Async =
        diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>;
    fn connect(url: &str, runtime: &tokio::runtime::Runtime) -> Self::Async {
        use diesel_async::{AsyncConnection, SimpleAsyncConnection};
        runtime.block_on(async {
            let mut conn = Self::Async::establish(url)
                .await
                .expect("an async SQLite connection");
            // As the test pools: writers wait for the write lock rather than fail.
            conn.batch_execute("PRAGMA busy_timeout = 60000")
                .await
                .unwrap();
            conn
        })
    }
}

#[cfg(feature = "postgres")]
impl AsyncOf for diesel::PgConnection {
    type Async = diesel_async::AsyncPgConnection;
    fn connect(url: &str, runtime: &tokio::runtime::Runtime) -> Self::Async {
        use diesel_async::AsyncConnection;
        runtime
            .block_on(Self::Async::establish(url))
            .expect("an async PostgreSQL connection")
    }
}

#[cfg(feature = "async-mysql")]
impl AsyncOf for diesel::MysqlConnection {
    type Async = diesel_async::AsyncMysqlConnection;
    fn connect(url: &str, runtime: &tokio::runtime::Runtime) -> Self::Async {
        use diesel_async::AsyncConnection;
        runtime
            .block_on(Self::Async::establish(url))
            .expect("an async MySQL connection")
    }
}

/// Implements [`Writes`] for the blocking connection `$sync` and the async one `$async`.
macro_rules! writes_for {
    ($sync:ty, $async:ty) => {
        impl Writes for Blocking<$sync> {
            const PATH: &'static str = "blocking";
            fn execute(&mut self, sql: &str) {
                diesel::connection::SimpleConnection::batch_execute(&mut *self.0, sql).unwrap();
            }
            fn record_statements(&mut self) -> Arc<Mutex<Vec<String>>> {
                let statements = Arc::new(Mutex::new(Vec::new()));
                self.0.set_instrumentation(recorder(&statements));
                statements
            }
            fn update(&mut self, row: &Order, patch: OrderPatch) -> Result<i64, Error> {
                GuardedWrite::guarded_update(row, &mut self.0, patch)
            }
            fn update_by_key(
                &mut self,
                id: i64,
                expected: i64,
                patch: OrderPatch,
            ) -> Result<i64, Error> {
                <Order as GuardedWrite>::guarded_update_by_key(&mut self.0, &id, &expected, patch)
            }
            fn save(&mut self, row: &mut Order) -> Result<i64, Error> {
                GuardedWrite::guarded_save(row, &mut self.0)
            }
            fn save_from(&mut self, row: &mut Order, original: &Order) -> Result<i64, Error> {
                GuardedWrite::guarded_save_from(row, &mut self.0, original)
            }
            fn touch(&mut self, row: &mut Order) -> Result<i64, Error> {
                GuardedWrite::guarded_touch(row, &mut self.0)
            }
            fn delete(&mut self, row: &Order) -> Result<(), Error> {
                GuardedWrite::guarded_delete(row, &mut self.0)
            }
            fn delete_by_key(&mut self, id: i64, expected: i64) -> Result<(), Error> {
                <Order as GuardedWrite>::guarded_delete_by_key(&mut self.0, &id, &expected)
            }
            fn add_one(
                &mut self,
                id: i64,
                suffix: &'static str,
                policy: &RetryPolicy,
            ) -> Result<Modified<Order, ()>, Error> {
                <Order as GuardedModify>::modify(&mut self.0, &id, policy, move |o| {
                    add_one_to(o, suffix)
                })
            }
            fn load(&mut self, id: i64) -> Option<Order> {
                orders::table
                    .find(id)
                    .select(Order::as_select())
                    .first(&mut self.0)
                    .optional()
                    .unwrap()
            }
            fn load_tracked(&mut self, id: i64) -> Option<TrackedOrder> {
                let query = orders::table.find(id).select(TrackedOrder::as_select());
                query.first(&mut self.0).optional().unwrap()
            }
            fn transition(&mut self, row: &mut TrackedOrder, to: OrderState) -> Result<i64, Error> {
                GuardedTransition::transition(row, &mut self.0, to, no_extra())
            }
            fn insert(&mut self, row: &mut Order) -> Result<i64, Error> {
                GuardedWrite::guarded_insert(row, &mut self.0)
            }
            fn set_views(&mut self, id: i64, views: i64) -> Result<(), Error> {
                <ViewedOrder as GuardedWrite>::update_excluded_by_key(
                    &mut self.0,
                    &id,
                    orders::views.eq(views),
                )
            }
            fn note_as_excluded(&mut self, id: i64) -> Result<(), Error> {
                <ViewedOrder as GuardedWrite>::update_excluded_by_key(
                    &mut self.0,
                    &id,
                    orders::note.eq("x"),
                )
            }
            fn upsert(&mut self, row: &mut Order) -> Result<Upserted<i64>, Error> {
                GuardedWrite::guarded_upsert(row, &mut self.0)
            }
            fn transition_if_more_than(
                &mut self,
                row: &mut TrackedOrder,
                to: OrderState,
                min: i32,
            ) -> Result<i64, Error> {
                let condition = orders::quantity.gt(min);
                GuardedTransition::transition_when(row, &mut self.0, to, no_extra(), condition)
            }
            fn transition_by_key(&mut self, id: i64, to: OrderState) -> Result<i64, Error> {
                let policy = RetryPolicy::default();
                <TrackedOrder as GuardedStatusTransition>::transition_by_key(
                    &mut self.0,
                    &id,
                    to,
                    no_extra(),
                    &policy,
                )
            }
            fn transition_recorded(
                &mut self,
                row: &mut TrackedOrder,
                to: OrderState,
                by: &'static str,
                fail: bool,
            ) -> Result<i64, HookError> {
                GuardedTransition::transition_then(
                    row,
                    &mut self.0,
                    to,
                    no_extra(),
                    |conn, from, row| {
                        let key = row.id.to_string();
                        diesel_occ::record(conn, &entry(&key, from, row, by))?;
                        hook_outcome(fail)
                    },
                )
            }
            fn transition_by_key_recorded(
                &mut self,
                id: i64,
                to: OrderState,
                by: &'static str,
                fail: bool,
            ) -> Result<TrackedOrder, HookError> {
                <TrackedOrder as GuardedStatusTransition>::transition_by_key_then(
                    &mut self.0,
                    &id,
                    to,
                    no_extra(),
                    |conn, from, row| {
                        let key = row.id.to_string();
                        diesel_occ::record(conn, &entry(&key, from, row, by))?;
                        hook_outcome(fail)
                    },
                )
            }
            fn add_locked(&mut self, id: i64, n: i32, wait: LockWait) -> Result<i32, Error> {
                <Order as Pessimistic>::with_row_locked(&mut self.0, &id, wait, |conn, row| {
                    let quantity = row.quantity + n;
                    diesel::update(orders::table.find(id))
                        .set(orders::quantity.eq(quantity))
                        .execute(conn)?;
                    Ok(quantity)
                })
            }
            fn note_if_current(
                &mut self,
                copy: &Order,
                note: &'static str,
            ) -> Result<Order, Error> {
                Pessimistic::with_copy_locked(copy, &mut self.0, LockWait::Wait, |conn, row| {
                    diesel::update(orders::table.find(row.id))
                        .set(orders::note.eq(note))
                        .execute(conn)?;
                    Ok(row)
                })
            }
            fn history(&mut self) -> Vec<(String, String, String, Option<String>)> {
                history_rows(history_query().load(&mut self.0).unwrap())
            }
            fn bulk_note(&mut self, min: i32, note: &'static str) -> Result<BulkReport, Error> {
                <Order as GuardedBulk>::guarded_bulk_update(
                    &mut self.0,
                    orders::quantity.ge(min),
                    orders::note.eq(note),
                )
            }
        }

        impl Writes for Async<$async> {
            fn execute(&mut self, sql: &str) {
                let sent = diesel_async::SimpleAsyncConnection::batch_execute(&mut self.conn, sql);
                self.runtime.block_on(sent).unwrap();
            }
            const PATH: &'static str = "async";
            fn record_statements(&mut self) -> Arc<Mutex<Vec<String>>> {
                let statements = Arc::new(Mutex::new(Vec::new()));
                diesel_async::AsyncConnection::set_instrumentation(
                    &mut self.conn,
                    recorder(&statements),
                );
                statements
            }
            fn update(&mut self, row: &Order, patch: OrderPatch) -> Result<i64, Error> {
                self.runtime.block_on(AsyncGuardedWrite::guarded_update(
                    row,
                    &mut self.conn,
                    patch,
                ))
            }
            fn update_by_key(
                &mut self,
                id: i64,
                expected: i64,
                patch: OrderPatch,
            ) -> Result<i64, Error> {
                self.runtime
                    .block_on(<Order as AsyncGuardedWrite>::guarded_update_by_key(
                        &mut self.conn,
                        &id,
                        &expected,
                        patch,
                    ))
            }
            fn save(&mut self, row: &mut Order) -> Result<i64, Error> {
                self.runtime
                    .block_on(AsyncGuardedWrite::guarded_save(row, &mut self.conn))
            }
            fn save_from(&mut self, row: &mut Order, original: &Order) -> Result<i64, Error> {
                self.runtime.block_on(AsyncGuardedWrite::guarded_save_from(
                    row,
                    &mut self.conn,
                    original,
                ))
            }
            fn touch(&mut self, row: &mut Order) -> Result<i64, Error> {
                self.runtime
                    .block_on(AsyncGuardedWrite::guarded_touch(row, &mut self.conn))
            }
            fn delete(&mut self, row: &Order) -> Result<(), Error> {
                self.runtime
                    .block_on(AsyncGuardedWrite::guarded_delete(row, &mut self.conn))
            }
            fn delete_by_key(&mut self, id: i64, expected: i64) -> Result<(), Error> {
                self.runtime
                    .block_on(<Order as AsyncGuardedWrite>::guarded_delete_by_key(
                        &mut self.conn,
                        &id,
                        &expected,
                    ))
            }
            fn add_one(
                &mut self,
                id: i64,
                suffix: &'static str,
                policy: &RetryPolicy,
            ) -> Result<Modified<Order, ()>, Error> {
                self.runtime.block_on(<Order as AsyncGuardedModify>::modify(
                    &mut self.conn,
                    &id,
                    policy,
                    move |o| add_one_to(o, suffix),
                ))
            }
            fn load(&mut self, id: i64) -> Option<Order> {
                let query = orders::table.find(id).select(Order::as_select());
                let read = diesel_async::RunQueryDsl::first(query, &mut self.conn);
                self.runtime.block_on(read).optional().unwrap()
            }
            fn load_tracked(&mut self, id: i64) -> Option<TrackedOrder> {
                let query = orders::table.find(id).select(TrackedOrder::as_select());
                let read = diesel_async::RunQueryDsl::first(query, &mut self.conn);
                self.runtime.block_on(read).optional().unwrap()
            }
            fn insert(&mut self, row: &mut Order) -> Result<i64, Error> {
                self.runtime
                    .block_on(AsyncGuardedWrite::guarded_insert(row, &mut self.conn))
            }
            fn set_views(&mut self, id: i64, views: i64) -> Result<(), Error> {
                let changes = orders::views.eq(views);
                let write = <ViewedOrder as AsyncGuardedWrite>::update_excluded_by_key(
                    &mut self.conn,
                    &id,
                    changes,
                );
                self.runtime.block_on(write)
            }
            fn note_as_excluded(&mut self, id: i64) -> Result<(), Error> {
                let changes = orders::note.eq("x");
                let write = <ViewedOrder as AsyncGuardedWrite>::update_excluded_by_key(
                    &mut self.conn,
                    &id,
                    changes,
                );
                self.runtime.block_on(write)
            }
            fn upsert(&mut self, row: &mut Order) -> Result<Upserted<i64>, Error> {
                self.runtime
                    .block_on(AsyncGuardedWrite::guarded_upsert(row, &mut self.conn))
            }
            fn transition(&mut self, row: &mut TrackedOrder, to: OrderState) -> Result<i64, Error> {
                self.runtime.block_on(AsyncGuardedTransition::transition(
                    row,
                    &mut self.conn,
                    to,
                    no_extra(),
                ))
            }
            fn transition_if_more_than(
                &mut self,
                row: &mut TrackedOrder,
                to: OrderState,
                min: i32,
            ) -> Result<i64, Error> {
                let condition = orders::quantity.gt(min);
                self.runtime
                    .block_on(AsyncGuardedTransition::transition_when(
                        row,
                        &mut self.conn,
                        to,
                        no_extra(),
                        condition,
                    ))
            }
            fn transition_by_key(&mut self, id: i64, to: OrderState) -> Result<i64, Error> {
                let policy = RetryPolicy::default();
                self.runtime
                    .block_on(<TrackedOrder as AsyncGuardedTransition>::transition_by_key(
                        &mut self.conn,
                        &id,
                        to,
                        no_extra(),
                        &policy,
                    ))
            }
            fn transition_recorded(
                &mut self,
                row: &mut TrackedOrder,
                to: OrderState,
                by: &'static str,
                fail: bool,
            ) -> Result<i64, HookError> {
                let moved = AsyncGuardedTransition::transition_then(
                    row,
                    &mut self.conn,
                    to,
                    no_extra(),
                    async move |conn: &mut $async, from, row: &TrackedOrder| {
                        let key = row.id.to_string();
                        diesel_occ::asynchronous::record(conn, &entry(&key, from, row, by)).await?;
                        hook_outcome(fail)
                    },
                );
                self.runtime.block_on(moved)
            }
            fn transition_by_key_recorded(
                &mut self,
                id: i64,
                to: OrderState,
                by: &'static str,
                fail: bool,
            ) -> Result<TrackedOrder, HookError> {
                let moved = <TrackedOrder as AsyncGuardedTransition>::transition_by_key_then(
                    &mut self.conn,
                    &id,
                    to,
                    no_extra(),
                    async move |conn: &mut $async, from, row: &TrackedOrder| {
                        let key = row.id.to_string();
                        diesel_occ::asynchronous::record(conn, &entry(&key, from, row, by)).await?;
                        hook_outcome(fail)
                    },
                );
                self.runtime.block_on(moved)
            }
            fn add_locked(&mut self, id: i64, n: i32, wait: LockWait) -> Result<i32, Error> {
                let work = <Order as AsyncPessimistic>::with_row_locked(
                    &mut self.conn,
                    &id,
                    wait,
                    async move |conn: &mut $async, row: Order| {
                        let quantity = row.quantity + n;
                        diesel_async::RunQueryDsl::execute(
                            diesel::update(orders::table.find(id))
                                .set(orders::quantity.eq(quantity)),
                            conn,
                        )
                        .await?;
                        Ok::<_, Error>(quantity)
                    },
                );
                self.runtime.block_on(work)
            }
            fn note_if_current(
                &mut self,
                copy: &Order,
                note: &'static str,
            ) -> Result<Order, Error> {
                let work = AsyncPessimistic::with_copy_locked(
                    copy,
                    &mut self.conn,
                    LockWait::Wait,
                    async move |conn: &mut $async, row: Order| {
                        diesel_async::RunQueryDsl::execute(
                            diesel::update(orders::table.find(row.id)).set(orders::note.eq(note)),
                            conn,
                        )
                        .await?;
                        Ok::<_, Error>(row)
                    },
                );
                self.runtime.block_on(work)
            }
            fn history(&mut self) -> Vec<(String, String, String, Option<String>)> {
                let rows = diesel_async::RunQueryDsl::load(history_query(), &mut self.conn);
                history_rows(self.runtime.block_on(rows).unwrap())
            }
            fn bulk_note(&mut self, min: i32, note: &'static str) -> Result<BulkReport, Error> {
                self.runtime
                    .block_on(<Order as AsyncGuardedBulk>::guarded_bulk_update(
                        &mut self.conn,
                        orders::quantity.ge(min),
                        orders::note.eq(note),
                    ))
            }
        }
    };
}

#[cfg(feature = "sqlite")]
writes_for!(
    diesel_occ::Pooled<diesel::SqliteConnection>,
    <diesel::SqliteConnection as AsyncOf>::Async
);
#[cfg(feature = "postgres")]
writes_for!(
    diesel_occ::Pooled<diesel::PgConnection>,
    diesel_async::AsyncPgConnection
);
#[cfg(feature = "async-mysql")]
writes_for!(
    diesel_occ::Pooled<diesel::MysqlConnection>,
    diesel_async::AsyncMysqlConnection
);

/// Inside a `for_each_backend!` module: `Async_` (the backend's diesel-async connection),
/// `manager(url)` (its pool manager; SQLite's connections wait for the write lock, as the
/// test pools' do) and `bb8_pool(url, max, runtime)`.
/// Writes each test body `fn(db, make_executor)` once per executor, as `#[test]`s in
/// modules `blocking` and `on_async` of a `for_each_backend!` module: each gets a fresh
/// database, prepared by `$prepare(&db)`, and a function that makes the executor (one per
/// thread, for the racing bodies).
#[macro_export]
macro_rules! tests_on_both_paths {
    ($prepare:expr; $($body:ident),* $(,)?) => {
        mod blocking {
            use super::*;
            $(#[test] fn $body() {
                let Some(db) = db() else { return };
                ($prepare)(&db);
                let pool = &db.pool;
                super::$body(&db, || common::paths::Blocking(pool.get().unwrap()));
            })*
        }
        mod on_async {
            use super::*;
            $(#[test] fn $body() {
                use common::paths::AsyncOf;
                let Some(db) = db() else { return };
                ($prepare)(&db);
                let url = &db.url;
                super::$body(&db, || {
                    let runtime = common::paths::runtime();
                    common::paths::Async { conn: Conn::connect(url, &runtime), runtime }
                });
            })*
        }
    };
}

#[macro_export]
macro_rules! async_pools {
    () => {
        type Async_ = <Conn as common::paths::AsyncOf>::Async;

        fn manager(
            url: &str,
        ) -> diesel_async::pooled_connection::AsyncDieselConnectionManager<Async_> {
            let mut config = diesel_async::pooled_connection::ManagerConfig::default();
            if BACKEND == "sqlite" {
                config.custom_setup = Box::new(|url| {
                    Box::pin(async move {
                        use diesel_async::{AsyncConnection, SimpleAsyncConnection};
                        let mut conn = Async_::establish(url).await?;
                        conn.batch_execute("PRAGMA busy_timeout = 60000")
                            .await
                            .map_err(diesel::ConnectionError::CouldntSetupConfiguration)?;
                        Ok(conn)
                    })
                });
            }
            diesel_async::pooled_connection::AsyncDieselConnectionManager::new_with_config(
                url, config,
            )
        }

        fn bb8_pool(
            url: &str,
            max: u32,
            runtime: &tokio::runtime::Runtime,
        ) -> diesel_async::pooled_connection::bb8::Pool<Async_> {
            runtime.block_on(async {
                diesel_async::pooled_connection::bb8::Pool::builder()
                    .max_size(max)
                    .build(manager(url))
                    .await
                    .expect("a bb8 pool")
            })
        }
    };
}
