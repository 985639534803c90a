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
/// you set on the connection afterwards replaces the watch, and the record of a read-only
/// refusal that [`manager_config_with_reply_timeout`]'s check reads.
///
/// Use it in a pool's manager through [`manager_config_with_reply_timeout`].
pub async fn establish_with_reply_timeout<C>(url: &str, bound: Duration) -> ConnectionResult<C>
where
    C: AsyncConnection + 'static,
{
    let (mut conn, watch) = if socket_of::has_socket::<C::Backend>() {
        socket_of::one_at_a_time_async(async {
            let before = socket_of::before();
            let conn = C::establish(url).await?;
            ConnectionResult::Ok((conn, socket_of::watch_new_socket(&before, bound)))
        })
        .await?
    } else {
        (C::establish(url).await?, None)
    };
    conn.set_instrumentation(Watched {
        watch,
        met_read_only: false,
        user: get_default_instrumentation(),
    });
    Ok(conn)
}

/// A bb8 or deadpool manager configuration whose connections are made by
/// [`establish_with_reply_timeout`]: `AsyncDieselConnectionManager::new_with_config(url,
/// manager_config_with_reply_timeout(bound))`. For MySQL / MariaDB,
/// `MysqlSettings::async_manager_config` (feature `async-mysql`) sets the bound along
/// with the session settings.
///
/// Its check before a connection is handed out again (bb8's `test_on_check_out`, on by
/// default: turned off, nothing is checked; deadpool's recycling) refuses one that met a
/// read-only server, so that the
/// pool connects again (after a failover the new connection may reach the primary), and
/// otherwise asks the server `SELECT 1`, as diesel-async's own check does.
#[cfg(any(feature = "bb8", feature = "async-deadpool"))]
pub fn manager_config_with_reply_timeout<C>(
    bound: Duration,
) -> diesel_async::pooled_connection::ManagerConfig<C>
where
    C: AsyncConnection + 'static,
    diesel::query_builder::SqlQuery: diesel_async::methods::ExecuteDsl<C>,
{
    let mut config = diesel_async::pooled_connection::ManagerConfig::default();
    config.custom_setup = Box::new(move |url| Box::pin(establish_with_reply_timeout(url, bound)));
    config.recycling_method = recycling_check();
    config
}

/// The check of [`manager_config_with_reply_timeout`]'s connections before they are
/// handed out again.
#[cfg(any(feature = "bb8", feature = "async-deadpool"))]
pub(crate) fn recycling_check<C>() -> diesel_async::pooled_connection::RecyclingMethod<C>
where
    C: AsyncConnection + 'static,
    diesel::query_builder::SqlQuery: diesel_async::methods::ExecuteDsl<C>,
{
    diesel_async::pooled_connection::RecyclingMethod::CustomFunction(Box::new(|conn: &mut C| {
        Box::pin(async move {
            if met_read_only(conn.instrumentation()) {
                return Err(diesel::result::Error::DatabaseError(
                    diesel::result::DatabaseErrorKind::Unknown,
                    Box::new("the connection met a read-only server".to_string()),
                ));
            }
            diesel_async::RunQueryDsl::execute(diesel::sql_query("SELECT 1"), conn)
                .await
                .map(drop)
        })
    }))
}

/// Whether the connection of `instrumentation` met a read-only server's refusal.
#[cfg(any(feature = "bb8", feature = "async-deadpool"))]
fn met_read_only(instrumentation: &mut dyn diesel::connection::Instrumentation) -> bool {
    instrumentation
        .downcast_ref::<Watched>()
        .is_some_and(|watched| watched.met_read_only)
}
