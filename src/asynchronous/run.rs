//! What a diesel-async connection answers for: running one of the library's operations.

use std::future::Future;

use super::source::AsyncConnectionSource;
use crate::operation::Operation;

/// An operation of the library ([`crate::op`]) that runs on diesel-async connection `C`:
/// the one bound a helper generic in the connection names for each write it makes
/// (`Update<Order, Ch>: AsyncRun<C>`).
///
/// Not a trait to implement: it holds for each operation on `AsyncPgConnection`,
/// `AsyncMysqlConnection` (feature `async-mysql`) and `SyncConnectionWrapper<SqliteConnection>`
/// (a pool's connection reaches them by `&mut *pooled`), whenever the entity's guard can
/// run on that backend. On SQLite the operation runs whole on the connection's thread, so
/// there it must be `'static` (its changes own their values).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot run on `{C}`",
    note = "the connection must be a diesel-async connection of a backend diesel-occ supports (`AsyncPgConnection`, `AsyncMysqlConnection`, `SyncConnectionWrapper<SqliteConnection>`), the changes for the entity's table, and the guard's SQL must fit that backend; on SQLite the changes must own their values (`'static`), since the write runs on the connection's thread",
    note = "a connection checked out of a pool is passed as `&mut *conn` (the pool's guard is not the connection)"
)]
pub trait AsyncRun<C> {
    /// Runs the operation on `conn`.
    #[doc(hidden)]
    fn run_async(
        self,
        conn: &mut C,
    ) -> impl Future<Output = Result<<Self as Operation>::Output, <Self as Operation>::Error>> + Send
    where
        Self: Operation + Sized;

    /// Runs the operation on connections from `pool`: by default on one connection
    /// checked out for the whole operation; a read-modify-write checks one out for each
    /// attempt, so that the waits between attempts hold none.
    #[doc(hidden)]
    fn run_pooled<S>(
        self,
        pool: &S,
    ) -> impl Future<Output = Result<<Self as Operation>::Output, <Self as Operation>::Error>> + Send
    where
        Self: Operation + Sized + Send,
        S: AsyncConnectionSource<Connection = C>,
    {
        async move {
            let mut conn = pool.checkout().await?;
            self.run_async(&mut *conn).await
        }
    }
}
