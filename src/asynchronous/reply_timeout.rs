//! diesel-async connections that wait for their server's reply no longer than a bound.

use std::time::Duration;

use diesel::connection::get_default_instrumentation;
use diesel::ConnectionResult;
use diesel_async::AsyncConnection;

use crate::connect::reply_bound::Watched;
use crate::connect::socket_of;

/// A connection to `url` whose statements wait at most `bound` for the server's reply:
/// past it the connection is closed under the statement, and the call returns what a
/// lost connection means at that point ([`Error::Ambiguous`](crate::Error::Ambiguous)
/// where the statement may have taken effect, a retryable loss before a commit
/// otherwise). See [`PoolConfig::reply_timeout`](crate::PoolConfig::reply_timeout) for
/// why and for what it covers; the bound applies to your own statements on the
/// connection too. Connections are made one at a time through this function (their
/// sockets are told apart that way). The default instrumentation
/// ([`diesel::connection::set_default_instrumentation`]) still receives every event; one
/// you set on the connection afterwards replaces the watch.
///
/// Use it in a pool's manager through [`manager_config_with_reply_timeout`].
pub async fn establish_with_reply_timeout<C>(url: &str, bound: Duration) -> ConnectionResult<C>
where
    C: AsyncConnection + 'static,
{
    let (mut conn, watch) = socket_of::one_at_a_time_async(async {
        let before = socket_of::before();
        let conn = C::establish(url).await?;
        ConnectionResult::Ok((conn, socket_of::watch_new_socket(&before, bound)))
    })
    .await?;
    if let Some(watch) = watch {
        conn.set_instrumentation(Watched {
            watch,
            user: get_default_instrumentation(),
        });
    }
    Ok(conn)
}

/// A bb8 or deadpool manager configuration whose connections are made by
/// [`establish_with_reply_timeout`]: `AsyncDieselConnectionManager::new_with_config(url,
/// manager_config_with_reply_timeout(bound))`. For MySQL / MariaDB,
/// `MysqlSettings::async_manager_config` (feature `async-mysql`) sets the bound along
/// with the session settings.
#[cfg(any(feature = "bb8", feature = "async-deadpool"))]
pub fn manager_config_with_reply_timeout<C>(
    bound: Duration,
) -> diesel_async::pooled_connection::ManagerConfig<C>
where
    C: AsyncConnection + 'static,
{
    let mut config = diesel_async::pooled_connection::ManagerConfig::default();
    config.custom_setup = Box::new(move |url| Box::pin(establish_with_reply_timeout(url, bound)));
    config
}
