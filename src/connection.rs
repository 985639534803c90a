//! Write transactions that behave the same on every backend.
//!
//! SQLite allows one writer at a time. A plain (deferred) transaction that reads first
//! and writes later must upgrade its lock, and when another connection writes meanwhile
//! SQLite fails it with "database is locked" at once, without waiting for the busy
//! timeout. Starting with `BEGIN IMMEDIATE` takes the write lock up front, so concurrent
//! writers queue behind the busy timeout instead. PostgreSQL and MySQL need nothing
//! special: their write transactions are ordinary ones.

use diesel::connection::Connection;
use diesel::result::Error as DieselError;

/// A connection that can run a transaction meant to write.
pub trait WriteTransaction: Connection {
    /// Runs `f` in a transaction that takes the write lock up front where the backend
    /// needs it (SQLite: `BEGIN IMMEDIATE`). Commits on `Ok`, rolls back on `Err`. Inside
    /// an open transaction it nests as a savepoint, like [`Connection::transaction`].
    fn write_transaction<T, E, F>(&mut self, f: F) -> Result<T, E>
    where
        F: FnOnce(&mut Self) -> Result<T, E>,
        E: From<DieselError>,
    {
        self.transaction(f)
    }
}

#[cfg(feature = "postgres")]
impl WriteTransaction for diesel::PgConnection {}

#[cfg(feature = "postgres")]
impl WriteTransaction
    for diesel::r2d2::PooledConnection<diesel::r2d2::ConnectionManager<diesel::PgConnection>>
{
}

#[cfg(feature = "mysql")]
impl WriteTransaction for diesel::MysqlConnection {}

#[cfg(feature = "mysql")]
impl WriteTransaction
    for diesel::r2d2::PooledConnection<diesel::r2d2::ConnectionManager<diesel::MysqlConnection>>
{
}

#[cfg(feature = "sqlite")]
impl WriteTransaction for diesel::SqliteConnection {
    fn write_transaction<T, E, F>(&mut self, f: F) -> Result<T, E>
    where
        F: FnOnce(&mut Self) -> Result<T, E>,
        E: From<DieselError>,
    {
        immediate(self, |conn| conn, f)
    }
}

#[cfg(feature = "sqlite")]
impl WriteTransaction
    for diesel::r2d2::PooledConnection<diesel::r2d2::ConnectionManager<diesel::SqliteConnection>>
{
    fn write_transaction<T, E, F>(&mut self, f: F) -> Result<T, E>
    where
        F: FnOnce(&mut Self) -> Result<T, E>,
        E: From<DieselError>,
    {
        // The pool's transaction manager keeps its state in the inner connection, so the
        // transaction is begun and ended there while `f` gets the pooled connection.
        immediate(self, |pooled| &mut **pooled, f)
    }
}

/// `BEGIN IMMEDIATE` on the SQLite connection inside `conn` (or a savepoint when a
/// transaction is already open), `f`, then commit or roll back.
#[cfg(feature = "sqlite")]
fn immediate<C, T, E, F>(
    conn: &mut C,
    inner: impl Fn(&mut C) -> &mut diesel::SqliteConnection,
    f: F,
) -> Result<T, E>
where
    C: Connection,
    F: FnOnce(&mut C) -> Result<T, E>,
    E: From<DieselError>,
{
    use diesel::connection::{AnsiTransactionManager, TransactionManager};
    let open = AnsiTransactionManager::transaction_manager_status_mut(inner(conn))
        .transaction_depth()?
        .is_some();
    if open {
        return conn.transaction(f);
    }
    AnsiTransactionManager::begin_transaction_sql(inner(conn), "BEGIN IMMEDIATE")?;
    match f(conn) {
        Ok(value) => match AnsiTransactionManager::commit_transaction(inner(conn)) {
            Ok(()) => Ok(value),
            Err(commit_error) => {
                // A failed COMMIT can leave the transaction open; end it, report the cause.
                let _ = AnsiTransactionManager::rollback_transaction(inner(conn));
                Err(commit_error.into())
            }
        },
        Err(e) => {
            AnsiTransactionManager::rollback_transaction(inner(conn))?;
            Err(e)
        }
    }
}
