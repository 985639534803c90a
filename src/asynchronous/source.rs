//! Pools of diesel-async connections: where the async API takes a pool, it takes an
//! [`AsyncConnectionSource`], implemented for bb8 (feature `bb8`) and deadpool (feature
//! `async-deadpool`) pools of `AsyncDieselConnectionManager`.

use std::future::Future;
use std::ops::DerefMut;

use diesel_async::AsyncConnection;

use crate::error::Error;

/// A pool that hands out diesel-async connections. A checkout that fails (the pool timed
/// out, the server refused a new connection) is [`Error::Pool`] with the pool's own error
/// as its source.
pub trait AsyncConnectionSource: Sync {
    /// The connection the pool hands out.
    type Connection: AsyncConnection + Send;

    /// A checked-out connection, back in the pool when dropped.
    type Checkout<'a>: DerefMut<Target = Self::Connection> + Send
    where
        Self: 'a;

    /// Checks a connection out.
    fn checkout(&self) -> impl Future<Output = Result<Self::Checkout<'_>, Error>> + Send;
}

/// Implements [`AsyncConnectionSource`] for bb8 and deadpool pools of connection `$conn`.
#[cfg(any(feature = "postgres", feature = "async-mysql", feature = "sqlite"))]
macro_rules! pools_of {
    ($conn:ty) => {
        #[cfg(feature = "bb8")]
        impl AsyncConnectionSource for diesel_async::pooled_connection::bb8::Pool<$conn> {
            type Connection = $conn;
            type Checkout<'a> = diesel_async::pooled_connection::bb8::PooledConnection<'a, $conn>;

            async fn checkout(&self) -> Result<Self::Checkout<'_>, Error> {
                self.get().await.map_err(Error::pool)
            }
        }

        #[cfg(feature = "async-deadpool")]
        impl AsyncConnectionSource for diesel_async::pooled_connection::deadpool::Pool<$conn> {
            type Connection = $conn;
            type Checkout<'a> = diesel_async::pooled_connection::deadpool::Object<$conn>;

            async fn checkout(&self) -> Result<Self::Checkout<'_>, Error> {
                self.get().await.map_err(Error::pool)
            }
        }
    };
}

#[cfg(feature = "postgres")]
pools_of!(diesel_async::AsyncPgConnection);
#[cfg(feature = "async-mysql")]
pools_of!(diesel_async::AsyncMysqlConnection);
#[cfg(feature = "sqlite")]
pools_of!(diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>);
