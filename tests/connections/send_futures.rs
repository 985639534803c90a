//! Every future of the async API that runs a flow is `Send` on every backend's
//! connection, whatever the caller's closure is: axum handlers and `tokio::spawn` need
//! it. Checked by the compiler: a future that is not `Send` fails this file's build.

#![cfg(feature = "async")]
#![allow(dead_code)] // Only compiled: the compiler's check is the test.

use diesel::prelude::*;
use diesel_occ::asynchronous::{guarded_operation, AsyncGuardedJson, AsyncGuardedModify};
use diesel_occ::{Error, RetryPolicy};

use crate::common::models::Order;

fn is_send<T: Send>(_: T) {}

/// The read-modify-write flows on connection `$conn` (with its pool `$pool`).
macro_rules! flows_are_send {
    ($module:ident, $conn:ty, $json:ty, $feature:literal) => {
        #[cfg(feature = $feature)]
        mod $module {
            use super::*;

            /// The SQL type of the backend's JSON columns.
            pub type JsonSql = $json;

            json_profiles!();

            fn flows(conn: &mut $conn, policy: &RetryPolicy) {
                is_send(Order::modify(conn, &1, policy, |o| {
                    o.note.push('!');
                    Ok::<_, Error>(())
                }));
                is_send(guarded_operation(conn, "billing", "run-1", policy, async |_: &mut $conn| {
                    Ok::<_, Error>(())
                }));
                let patch = serde_json::json!({ "tier": "gold" });
                is_send(Profile::merge_json(conn, &1, profiles::ext, &patch, policy));
                is_send(Profile::edit_json(conn, &1, profiles::ext, policy, |doc| {
                    doc["seen"] = true.into();
                    Ok::<_, Error>(())
                }));
            }

            #[cfg(feature = "bb8")]
            fn pooled(pool: &diesel_async::pooled_connection::bb8::Pool<$conn>, policy: &RetryPolicy) {
                is_send(Order::modify_pooled(pool, &1, policy, |o| {
                    o.note.push('!');
                    Ok::<_, Error>(())
                }));
            }
        }
    };
}

flows_are_send!(
    postgres,
    diesel_async::AsyncPgConnection,
    diesel::sql_types::Jsonb,
    "postgres"
);
flows_are_send!(
    mysql,
    diesel_async::AsyncMysqlConnection,
    diesel::sql_types::Json,
    "async-mysql"
);
flows_are_send!(
    sqlite,
    diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>,
    diesel::sql_types::Json,
    "sqlite"
);
