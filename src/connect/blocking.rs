//! The library's calls from async code (feature `tokio`).
//!
//! diesel and r2d2 block, and a blocked runtime thread stalls every request it serves.
//! [`with_connection`] runs the blocking work on tokio's blocking pool with a connection
//! from a pool (r2d2, or deadpool-diesel with the `deadpool` feature), and hands back its result. Everything of one operation (checkout,
//! transaction, retries, return of the connection) happens inside that one blocking task.
//!
//! Cancellation: when the caller's future is dropped (the client went away, a timeout
//! fired), the blocking task is not interrupted: it runs to its end, so its transaction
//! commits or rolls back as it would have, and the connection goes back to the pool with
//! no transaction open. Only the result is lost. A task is never stopped halfway through a
//! transaction, so cancellation cannot leave one open or half-applied.

use crate::connect::source::ConnectionSource;
use crate::error::Error;

/// Runs `work` on tokio's blocking pool with a connection from `pool`, and returns its
/// result. `work` gets the connection for its whole run (its own transactions, retries
/// with [`RetryPolicy`](crate::RetryPolicy), ...); a checkout that fails is
/// [`Error::Pool`]. A panic in `work` resumes in the caller, as if it had run there.
///
/// ```no_run
/// # async fn handler(pool: diesel_occ::SqlitePool) -> Result<(), diesel_occ::Error> {
/// use diesel::prelude::*;
///
/// let one: i64 = diesel_occ::with_connection(&pool, |conn| {
///     diesel::sql_query("SELECT 1").execute(conn)?;
///     Ok::<_, diesel_occ::Error>(1)
/// })
/// .await?;
/// # Ok(()) }
/// ```
pub async fn with_connection<S, T, E, F>(pool: &S, work: F) -> Result<T, E>
where
    S: ConnectionSource,
    F: FnOnce(&mut S::Connection) -> Result<T, E> + Send + 'static,
    T: Send + 'static,
    E: From<Error> + Send + 'static,
{
    let pool = pool.clone();
    let parent = crate::telemetry::Parent::current();
    let task = tokio::task::spawn_blocking(move || {
        parent.run(|| pool.on_connection(work).map_err(E::from)?)
    });
    match task.await {
        Ok(result) => result,
        Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
        // Only a runtime shutting down cancels a blocking task before it starts.
        Err(join) => Err(Error::InvalidSetting {
            what: "async runtime",
            reason: format!("the blocking task did not run: {join}"),
        }
        .into()),
    }
}
