//! Pools of diesel-async connections: where the async API takes a pool, it takes an
//! [`AsyncConnectionSource`], implemented for bb8 (feature `bb8`) and deadpool (feature
//! `async-deadpool`) pools of `AsyncDieselConnectionManager`.

use std::future::Future;
use std::ops::DerefMut;

use super::write_transaction::AsyncWriteConnection;
use crate::error::Error;

/// A pool that hands out diesel-async connections: a bb8 or deadpool pool (a handle that
/// tasks of their own can keep, as the async locks' keep-alive does). A checkout that
/// fails (the pool timed out, the server refused a new connection) is [`Error::Pool`]
/// with the pool's own error as its source. Not a trait to implement.
pub trait AsyncConnectionSource: Clone + Send + Sync + 'static {
    /// The connection the pool hands out.
    type Connection: AsyncWriteConnection;

    /// A checked-out connection, back in the pool when dropped.
    type Checkout<'a>: DerefMut<Target = Self::Connection> + Send
    where
        Self: 'a;

    /// Checks a connection out. Use it in your own handlers too: a connection that a
    /// cancelled call left broken (inside an open transaction) never goes back into the
    /// pool, on deadpool as on bb8.
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
                let pool = self.clone();
                in_own_task(async move { pool.get_owned().await }).await
            }
        }

        #[cfg(feature = "async-deadpool")]
        impl AsyncConnectionSource for diesel_async::pooled_connection::deadpool::Pool<$conn> {
            type Connection = $conn;
            type Checkout<'a> =
                DeadpoolCheckout<diesel_async::pooled_connection::deadpool::Object<$conn>>;

            async fn checkout(&self) -> Result<Self::Checkout<'_>, Error> {
                let pool = self.clone();
                let object = in_own_task(async move { pool.get().await }).await?;
                Ok(object.into())
            }
        }

        #[cfg(feature = "async-deadpool")]
        impl From<diesel_async::pooled_connection::deadpool::Object<$conn>>
            for DeadpoolCheckout<diesel_async::pooled_connection::deadpool::Object<$conn>>
        {
            fn from(object: diesel_async::pooled_connection::deadpool::Object<$conn>) -> Self {
                use diesel_async::pooled_connection::{deadpool::Object, PoolableConnection};
                DeadpoolCheckout {
                    object: Some(object),
                    put_back: |mut object: Object<$conn>| {
                        // As bb8 judges it: dropped in a panic, or broken. A check that
                        // panics itself (SQLite's connection mutex poisoned by a panic in
                        // caller code on its thread) counts as broken.
                        let broken = std::thread::panicking()
                            || std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                PoolableConnection::is_broken(&mut *object)
                            }))
                            .unwrap_or(true);
                        if broken {
                            drop(Object::take(object));
                        }
                    },
                }
            }
        }
    };
}

/// A connection checked out of a deadpool pool that leaves the pool when it is put back
/// broken. deadpool tests a connection only when it hands it out again: one that a
/// cancelled call left inside an open transaction would wait idle in the pool with that
/// transaction open on the server (its row locks; on SQLite the database's write lock)
/// held against every other writer, until its next checkout. Dropped broken, or during a
/// panic, this one is taken out of the pool and closed, which ends the transaction once
/// any statement still running on the server has finished. (bb8 tests a connection when
/// it comes back.)
///
/// [`AsyncConnectionSource::checkout`] returns one; a connection from deadpool's own
/// `Pool::get` becomes one with `DeadpoolCheckout::from(object)`, for a handler that may be
/// cancelled while it holds it.
#[cfg(feature = "async-deadpool")]
pub struct DeadpoolCheckout<O> {
    object: Option<O>,
    /// Returns the object to its pool, or takes it out and closes it when broken.
    put_back: fn(O),
}

#[cfg(feature = "async-deadpool")]
impl<O: std::ops::Deref> std::ops::Deref for DeadpoolCheckout<O> {
    type Target = O::Target;

    fn deref(&self) -> &O::Target {
        self.object.as_ref().expect("held until dropped")
    }
}

#[cfg(feature = "async-deadpool")]
impl<O: DerefMut> DerefMut for DeadpoolCheckout<O> {
    fn deref_mut(&mut self) -> &mut O::Target {
        self.object.as_mut().expect("held until dropped")
    }
}

#[cfg(feature = "async-deadpool")]
impl<O> Drop for DeadpoolCheckout<O> {
    fn drop(&mut self) {
        if let Some(object) = self.object.take() {
            (self.put_back)(object);
        }
    }
}

/// Runs a pool's checkout as a task of its own, so that it ends whole even when its caller
/// is dropped. Both pools test a connection before handing it out (a `SELECT 1`), and a
/// checkout dropped in the middle of that test puts the connection back in the pool; on
/// MySQL its client then leaves the rest of the reply on the socket, and the connection's
/// next user reads it ("packet out of order"). Found by the lock cancellation test; the
/// cost is one task per checkout.
#[cfg(any(feature = "bb8", feature = "async-deadpool"))]
async fn in_own_task<T, E>(
    checkout: impl Future<Output = Result<T, E>> + Send + 'static,
) -> Result<T, Error>
where
    T: Send + 'static,
    E: std::error::Error + Send + Sync + 'static,
{
    match tokio::spawn(checkout).await {
        Ok(checked_out) => checked_out.map_err(Error::pool),
        Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
        Err(join) => Err(Error::pool(join)),
    }
}

#[cfg(feature = "postgres")]
pools_of!(diesel_async::AsyncPgConnection);
#[cfg(feature = "async-mysql")]
pools_of!(diesel_async::AsyncMysqlConnection);
#[cfg(feature = "sqlite")]
pools_of!(diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>);
