//! SQLite through diesel-async's `SyncConnectionWrapper`: a blocking connection on a
//! thread of its own. Each call of the library runs whole on that thread, as the blocking
//! API runs it (its immediate transactions and fair write queue included), and the
//! caller awaits the result. A dropped future leaves the call to finish there: nothing
//! is left half done, and the connection's next call waits for it. The calls that run
//! the caller's async code inside a transaction (a write transaction, a guarded
//! operation, a transition hook, work on a locked row, a write while a lock is held) open
//! it from the awaiting task; dropped before it ended, that transaction leaves the
//! connection marked broken, and every later call on it is refused.

use std::future::Future;

use diesel::SqliteConnection;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;

use super::run::AsyncRun;
use crate::error::Error;
use crate::operation::{Operation, Run};

/// diesel-async's SQLite connection.
type AsyncSqlite = SyncConnectionWrapper<SqliteConnection>;

/// Runs `call` on `conn`'s thread and hands back its result. A panic in `call` (the
/// caller's code panicked) is resumed in the awaiting task, as on the other backends,
/// after the transactions it left open on the connection were rolled back: the
/// connection goes back to its pool clean, neither inside a transaction (holding the
/// database's write lock) nor poisoned (diesel-async's check of a poisoned connection
/// panics, and bb8 loses the connection's place when it does).
fn on_thread<R, E>(
    conn: &mut AsyncSqlite,
    call: impl FnOnce(&mut SqliteConnection) -> Result<R, E> + Send + 'static,
) -> impl Future<Output = Result<R, E>> + Send + 'static
where
    R: Send + 'static,
    E: From<Error> + Send + 'static,
{
    let parent = crate::telemetry::Parent::current();
    let task = conn.spawn_blocking(move |conn| {
        parent.run(|| {
            usable(conn)?;
            Ok(rolled_back_on_panic(conn, call))
        })
    });
    async move {
        match task.await.map_err(|e| E::from(Error::Database(e)))? {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

/// Refuses a connection whose transaction manager a dropped transaction left broken (the
/// transaction may still be open on it), as the other backends' calls refuse theirs:
/// nothing more is sent on it, so no write lands in a transaction that will never commit.
fn usable(conn: &mut SqliteConnection) -> diesel::QueryResult<()> {
    use diesel::connection::{AnsiTransactionManager, TransactionManager};
    AnsiTransactionManager::transaction_manager_status_mut(conn)
        .transaction_depth()
        .map(drop)
}

/// Runs `call` on `conn`, catching a panic: the transactions opened in `call` and left
/// open by it are rolled back before the panic is handed on. A rollback that fails
/// leaves the transaction manager broken, so that pools discard the connection.
fn rolled_back_on_panic<R>(
    conn: &mut SqliteConnection,
    call: impl FnOnce(&mut SqliteConnection) -> R,
) -> std::thread::Result<R> {
    use diesel::connection::{AnsiTransactionManager, TransactionManager};
    let depth = |conn: &mut SqliteConnection| {
        AnsiTransactionManager::transaction_manager_status_mut(conn)
            .transaction_depth()
            .ok()
            .flatten()
            .map_or(0, u32::from)
    };
    let before = depth(conn);
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| call(conn)));
    if outcome.is_err() {
        while depth(conn) > before {
            if AnsiTransactionManager::rollback_transaction(conn).is_err() {
                break;
            }
        }
    }
    outcome
}

/// Every operation of the library: run whole on the connection's thread, as the blocking
/// API runs it. Sent there when the future is first polled, as on the other backends: a
/// future dropped before that writes nothing.
impl<O> AsyncRun<AsyncSqlite> for O
where
    O: Operation + Run<SqliteConnection> + Send + 'static,
    O::Output: Send + 'static,
    O::Error: Send + 'static,
{
    async fn run_async(
        self,
        conn: &mut AsyncSqlite,
    ) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        on_thread(conn, move |conn| self.run(conn)).await
    }
}

#[cfg(feature = "locks")]
impl super::lock_connection::LockStatements for AsyncSqlite {
    fn check_held<'a>(
        &'a mut self,
        key: &'a crate::locks::lock::LockKey,
        holder: &'a str,
        fence: i64,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'a {
        use crate::locks::lock::LockConnection;
        let (key, holder) = (key.clone(), holder.to_string());
        on_thread(self, move |conn| conn.check_held(&key, &holder, fence))
    }

    fn acquire_lock<'a>(
        &'a mut self,
        key: &'a crate::locks::lock::LockKey,
        holder: &'a str,
        label: Option<&'a str>,
        ttl: std::time::Duration,
        wait: std::time::Duration,
    ) -> impl Future<Output = Result<i64, Error>> + Send + 'a {
        use crate::locks::lock::LockConnection;
        let (key, holder, label) = (key.clone(), holder.to_string(), label.map(str::to_string));
        on_thread(self, move |conn| {
            conn.acquire_lock(&key, &holder, label.as_deref(), ttl, wait)
        })
    }

    fn renew_lock<'a>(
        &'a mut self,
        key: &'a crate::locks::lock::LockKey,
        holder: &'a str,
        fence: i64,
        ttl: std::time::Duration,
        wait: std::time::Duration,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'a {
        use crate::locks::lock::LockConnection;
        let (key, holder) = (key.clone(), holder.to_string());
        on_thread(self, move |conn| {
            conn.renew_lock(&key, &holder, fence, ttl, wait)
        })
    }

    fn release_lock<'a>(
        &'a mut self,
        key: &'a crate::locks::lock::LockKey,
        holder: &'a str,
        fence: i64,
        wait: std::time::Duration,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'a {
        use crate::locks::lock::LockConnection;
        let (key, holder) = (key.clone(), holder.to_string());
        on_thread(self, move |conn| {
            conn.release_lock(&key, &holder, fence, wait)
        })
    }
}

/// The blocking path's write transaction: this process's earlier writers first, then
/// `BEGIN IMMEDIATE` (a savepoint inside an open transaction).
impl crate::drive::on_async::transaction::BeginWrite for AsyncSqlite {
    async fn begin_write(
        &mut self,
    ) -> diesel::QueryResult<crate::drive::on_async::transaction::WriteTurn> {
        use diesel::connection::{AnsiTransactionManager, TransactionManager};
        self.spawn_blocking(|conn| {
            let open = AnsiTransactionManager::transaction_manager_status_mut(conn)
                .transaction_depth()?
                .is_some();
            if open {
                AnsiTransactionManager::begin_transaction(conn)?;
                return Ok(Default::default());
            }
            // Ended by the transaction's future, wherever it runs then.
            let turn = crate::connect::write_gate::wait_for_turn_to_send(
                crate::connect::write_gate::MAX_WAIT,
            );
            AnsiTransactionManager::begin_transaction_sql(conn, "BEGIN IMMEDIATE")?;
            Ok(crate::drive::on_async::transaction::WriteTurn { _turn: turn })
        })
        .await
    }
}

/// Reads by key on the connection's thread, as the blocking path reads.
impl<T> crate::drive::on_async::send::AsyncLoadByKey<AsyncSqlite> for T
where
    T: crate::drive::blocking::load::LoadByKey<SqliteConnection> + Send + 'static,
{
    fn load_by_key(
        conn: &mut AsyncSqlite,
        key: &T::Key,
    ) -> impl Future<Output = diesel::QueryResult<Option<T>>> + Send {
        let key = key.clone();
        conn.spawn_blocking(move |conn| {
            usable(conn)?;
            T::load_by_key(conn, &key)
        })
    }

    fn read_by_key(
        conn: &mut AsyncSqlite,
        key: &T::Key,
    ) -> impl Future<Output = diesel::QueryResult<Option<T>>> + Send {
        let key = key.clone();
        conn.spawn_blocking(move |conn| {
            usable(conn)?;
            T::read_by_key(conn, &key)
        })
    }

    fn lock_by_key(
        conn: &mut AsyncSqlite,
        key: &T::Key,
        lock: crate::sql::statement::RowLock,
    ) -> impl Future<Output = diesel::QueryResult<Option<T>>> + Send {
        let key = key.clone();
        conn.spawn_blocking(move |conn| {
            usable(conn)?;
            T::lock_by_key(conn, &key, lock)
        })
    }

    fn load_by_keys(
        conn: &mut AsyncSqlite,
        keys: &[T::Key],
    ) -> impl Future<Output = diesel::QueryResult<Vec<T>>> + Send {
        let keys = keys.to_vec();
        conn.spawn_blocking(move |conn| {
            usable(conn)?;
            T::load_by_keys(conn, &keys)
        })
    }

    fn table_name() -> &'static str {
        <T as crate::drive::blocking::load::LoadByKey<SqliteConnection>>::table_name()
    }
}
