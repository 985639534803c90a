//! The orders API of the example service, for each backend (`sqlite`, `postgres`,
//! `mysql` modules with the same items), on diesel-async connections from any pool the
//! library takes (bb8 or deadpool); `main.rs` serves it and the end-to-end tests
//! (`tests/connections/http_service.rs`) drive it over HTTP with both pools.
//!
//! - `POST /orders/{id}`: create, 201 with its `ETag` (409 when the id is taken);
//! - `GET /orders/{id}`: 200 with `ETag`, or 304 for a matching `If-None-Match`;
//! - `PUT /orders/{id}` with `If-Match` (428 without): replaces the JSON extension of that
//!   version only (412 when the order moved on; 422 when `ext` is not an object);
//! - `PATCH /orders/{id}` of the JSON extension: `application/merge-patch+json` (with
//!   `If-Match`: applied only to that version, else 412; without: merged into the latest
//!   version with retries, never losing another writer's keys) or
//!   `application/json-patch+json` (its operations are written for one version, so
//!   `If-Match` is required: 428 without it);
//! - `POST /orders/{id}/ship` and `/cancel`: guarded transitions, 409 naming the current
//!   state when the order has moved on.
//!
//! The library does the HTTP glue: `Error` is a response (an RFC 9457 problem with the
//! right status), `?` takes the precondition checks and the writes alike, `Tagged` sends
//! a row with its `ETag`, `PatchBody` refuses bodies of the wrong type or shape, and
//! `find_by_key` answers a missing order with 404.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use std::time::Duration;

use diesel::prelude::*;
use diesel_async::pooled_connection::{bb8, deadpool, AsyncDieselConnectionManager, ManagerConfig};
use diesel_async::SimpleAsyncConnection;
use diesel_occ::asynchronous::prelude::*;
use diesel_occ::asynchronous::{AsyncCandidate, AsyncConnectionSource, AsyncLocks};
use diesel_occ::http::{IfMatch, IfNoneMatch, PatchBody, Tagged};
use diesel_occ::{no_extra, ElectionTiming, Held};
use diesel_occ::{Error, Guarded, RetryPolicy, Status};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::{json, Value};

/// Any error of setting the service up.
pub type SetupError = Box<dyn std::error::Error + Send + Sync>;

/// The retry policy of every read-merge-write and transition (the library reports each
/// retry, conflict and leadership change itself: see `main.rs`).
fn policy() -> RetryPolicy {
    RetryPolicy::default()
}

/// The body of a `PUT`: the whole JSON extension.
#[derive(Deserialize)]
pub struct Replacement {
    pub ext: Value,
}

/// The background job, on the leader only: a tick every 5 s while this instance leads.
/// When the lead is lost or the service shuts down, the job's future is dropped at its next
/// `.await`, and the lock is freed only after that.
async fn nightly_job(held: Held) {
    tracing::info!(fence = held.fence(), "leading: the nightly job runs here");
    loop {
        tokio::time::sleep(Duration::from_secs(5)).await;
        tracing::info!(fence = held.fence(), "nightly job: tick");
    }
}

macro_rules! orders_api {
    ($($backend:ident: $conn:ty, $json_sql:ty, $json_ddl:literal;)*) => {$(
        pub mod $backend {
            use super::*;

            /// The connection every handler works on.
            pub type Conn = $conn;
            type JsonSql = $json_sql;

            diesel::table! {
                use diesel::sql_types::*;
                use super::JsonSql;

                service_orders (id) {
                    id -> BigInt,
                    status -> Text,
                    ext -> JsonSql,
                    version -> BigInt,
                }
            }

            /// The states of an order and which may move to which.
            #[derive(Debug, Clone, Copy, PartialEq, Eq, Status)]
            pub enum OrderStatus {
                Valid,
                #[occ(from(Valid))]
                Shipped,
                #[occ(from(Valid))]
                Cancelled,
            }

            /// The state as the API shows it: its stored name, as refusals name it.
            fn state_name<S: Serializer>(state: &OrderStatus, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(state.name())
            }

            #[derive(Debug, Clone, Queryable, Selectable, Identifiable, Insertable, Guarded, Serialize)]
            #[diesel(table_name = service_orders)]
            pub struct Order {
                pub id: i64,
                #[occ(status)]
                #[serde(serialize_with = "state_name")]
                pub status: OrderStatus,
                #[occ(json)]
                pub ext: Value,
                /// Sent as the `ETag`, not in the body.
                #[occ(version)]
                #[serde(skip)]
                pub version: i64,
            }

            /// Creates the library's tables and the orders table (dropping an old one),
            /// on a connection of `pool`.
            pub async fn setup<P: AsyncConnectionSource<Connection = Conn>>(pool: &P) -> Result<(), SetupError> {
                let conn = &mut *pool.checkout().await?;
                diesel_occ::migrations::run_async(conn).await?;
                conn.batch_execute("DROP TABLE IF EXISTS service_orders").await?;
                conn.batch_execute(concat!(
                    "CREATE TABLE service_orders (id BIGINT PRIMARY KEY NOT NULL, ",
                    "status VARCHAR(16) NOT NULL, ext ", $json_ddl, " NOT NULL, version BIGINT NOT NULL)"
                ))
                .await?;
                Ok(())
            }

            /// The manager of both pools (SQLite's connections wait up to 5 s for the
            /// write lock, as the blocking pools' do).
            fn manager(url: &str) -> AsyncDieselConnectionManager<Conn> {
                let mut config = ManagerConfig::default();
                if stringify!($backend) == "sqlite" {
                    config.custom_setup = Box::new(|url| {
                        Box::pin(async move {
                            use diesel_async::AsyncConnection;
                            let mut conn = Conn::establish(url).await?;
                            conn.batch_execute("PRAGMA busy_timeout = 5000; PRAGMA journal_mode = WAL")
                                .await
                                .map_err(diesel::ConnectionError::CouldntSetupConfiguration)?;
                            Ok(conn)
                        })
                    });
                }
                AsyncDieselConnectionManager::new_with_config(url, config)
            }

            /// A bb8 pool of diesel-async connections to `url`.
            pub async fn bb8_pool(url: &str) -> Result<bb8::Pool<Conn>, SetupError> {
                Ok(bb8::Pool::builder().max_size(10).build(manager(url)).await?)
            }

            /// A deadpool pool of diesel-async connections to `url`.
            pub fn deadpool_pool(url: &str) -> Result<deadpool::Pool<Conn>, SetupError> {
                Ok(deadpool::Pool::builder(manager(url)).max_size(10).build()?)
            }

            /// Runs for leadership of the nightly job under `label`; the job runs while this
            /// instance leads.
            pub fn campaign<P: AsyncConnectionSource<Connection = Conn>>(pool: P, label: &str, timing: ElectionTiming) -> Result<AsyncCandidate, Error> {
                AsyncCandidate::start_with_job(AsyncLocks::new(pool), "orders-service", "nightly", label, timing, nightly_job)
            }

            pub fn router<P: AsyncConnectionSource<Connection = Conn>>(pool: P) -> Router {
                Router::new()
                    .route("/orders/{id}", post(create::<P>).get(read::<P>).put(replace::<P>).patch(patch::<P>))
                    .route("/orders/{id}/ship", post(ship::<P>))
                    .route("/orders/{id}/cancel", post(cancel::<P>))
                    .with_state(pool)
            }

            async fn create<P: AsyncConnectionSource<Connection = Conn>>(State(pool): State<P>, Path(id): Path<i64>) -> Result<impl IntoResponse, Error> {
                let mut order = Order { id, status: OrderStatus::Valid, ext: json!({}), version: 0 };
                order.guarded_insert(&mut *pool.checkout().await?).await?;
                Ok((StatusCode::CREATED, Tagged(order)))
            }

            async fn read<P: AsyncConnectionSource<Connection = Conn>>(State(pool): State<P>, Path(id): Path<i64>, if_none_match: IfNoneMatch) -> Result<Response, Error> {
                let order = Order::find_by_key(&mut *pool.checkout().await?, &id).await?;
                Ok(if_none_match.respond(order))
            }

            async fn replace<P: AsyncConnectionSource<Connection = Conn>>(
                State(pool): State<P>,
                Path(id): Path<i64>,
                if_match: IfMatch,
                Json(replacement): Json<Replacement>,
            ) -> Result<Tagged<Order>, Error> {
                if_match.required()?;
                let conn = &mut *pool.checkout().await?;
                let mut order = Order::find_by_key(conn, &id).await?;
                if_match.check_row(&order, true)?;
                order.ext = replacement.ext;
                // Guarded by the version just checked: a write in between is 412 too.
                order.guarded_save(conn).await?;
                Ok(Tagged(order))
            }

            async fn patch<P: AsyncConnectionSource<Connection = Conn>>(
                State(pool): State<P>,
                Path(id): Path<i64>,
                if_match: IfMatch,
                body: PatchBody,
            ) -> Result<Tagged<Order>, Error> {
                let conn = &mut *pool.checkout().await?;
                let done = match body {
                    // With If-Match only onto that version; without, onto the latest,
                    // retried on conflicts: a merge never drops another writer's keys.
                    PatchBody::Merge(patch) => {
                        Order::merge_json_if_match(conn, &id, service_orders::ext, &patch, &if_match, &policy()).await?
                    }
                    PatchBody::Operations(operations) => {
                        Order::patch_json_if_match(conn, &id, service_orders::ext, &operations, if_match.required()?, &policy()).await?
                    }
                };
                Ok(Tagged(done.row))
            }

            async fn ship<P: AsyncConnectionSource<Connection = Conn>>(State(pool): State<P>, Path(id): Path<i64>) -> Result<Tagged<Order>, Error> {
                transition(pool, id, OrderStatus::Shipped).await
            }

            async fn cancel<P: AsyncConnectionSource<Connection = Conn>>(State(pool): State<P>, Path(id): Path<i64>) -> Result<Tagged<Order>, Error> {
                transition(pool, id, OrderStatus::Cancelled).await
            }

            async fn transition<P: AsyncConnectionSource<Connection = Conn>>(pool: P, id: i64, to: OrderStatus) -> Result<Tagged<Order>, Error> {
                let conn = &mut *pool.checkout().await?;
                Order::transition_by_key(conn, &id, to, no_extra(), &policy()).await?;
                tracing::info!(id, to = to.name(), "moved");
                Ok(Tagged(Order::find_by_key(conn, &id).await?))
            }
        }
    )*};
}

orders_api! {
    sqlite: diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>, diesel::sql_types::Json, "TEXT";
    postgres: diesel_async::AsyncPgConnection, diesel::sql_types::Jsonb, "JSONB";
    mysql: diesel_async::AsyncMysqlConnection, diesel::sql_types::Json, "JSON";
}
