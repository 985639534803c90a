//! The orders API of the example service, for each backend (`sqlite`, `postgres`,
//! `mysql` modules with the same items), on diesel-async connections from a bb8 pool;
//! `main.rs` serves it and the end-to-end tests (`tests/connections/http_service.rs`) drive it over
//! HTTP.
//!
//! - `POST /orders/{id}`: create, 201 with its `ETag`;
//! - `GET /orders/{id}`: 200 with `ETag`, or 304 for a matching `If-None-Match`;
//! - `PATCH /orders/{id}` of the JSON extension: `application/merge-patch+json` (with
//!   `If-Match`: applied only to that version, else 412; without: merged into the latest
//!   version with retries, never losing another writer's keys) or
//!   `application/json-patch+json` (its operations depend on the version they were made
//!   for, so `If-Match` is required: 428 without it);
//! - `POST /orders/{id}/ship` and `/cancel`: guarded transitions, 409 naming the current
//!   state when the order has moved on.
//!
//! Every failure is an RFC 9457 problem (`diesel_occ::http::Problem`).

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_async::pooled_connection::{bb8, AsyncDieselConnectionManager, ManagerConfig};
use diesel_async::RunQueryDsl;
use diesel_occ::asynchronous::prelude::*;
use diesel_occ::asynchronous::{AsyncCandidate, AsyncConnectionSource, AsyncLocks};
use diesel_occ::http::{EntityTag, IfMatch, IfNoneMatch, Problem};
use diesel_occ::{no_extra, ElectionTiming, Held};
use diesel_occ::{Error, Guarded, RetryPolicy, Status, Token};
use serde_json::{json, Value};

/// A failure as an HTTP answer.
pub struct Failure(Problem);

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        match &error {
            Error::Conflict(_) | Error::InvalidTransition(_) => {
                tracing::info!(%error, "refused a stale or invalid write")
            }
            Error::RetriesExhausted { .. } | Error::Retryable { .. } => {
                tracing::warn!(%error, "busy")
            }
            Error::NotFound { .. } | Error::InvalidPatch { .. } => {}
            _ => tracing::error!(%error, "failed"),
        }
        Failure(Problem::from(&error))
    }
}

impl From<diesel_occ::http::HttpError> for Failure {
    fn from(error: diesel_occ::http::HttpError) -> Self {
        Failure(Problem::from(&error))
    }
}

impl From<diesel::result::Error> for Failure {
    fn from(error: diesel::result::Error) -> Self {
        Failure::from(Error::from(error))
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        self.0.into_response()
    }
}

/// The retry policy of every read-merge-write, logging each retry.
fn policy() -> RetryPolicy {
    RetryPolicy::default().on_retry(|retry| {
        tracing::info!(attempt = retry.attempt, delay = ?retry.delay, error = %retry.error, "retrying")
    })
}

/// The order as the API shows it, with its `ETag`.
fn representation(
    status: StatusCode,
    id: i64,
    state: &str,
    ext: &Value,
    token: &Token,
) -> Response {
    let etag = EntityTag::of(token);
    (
        status,
        [(header::ETAG, etag.header_value())],
        Json(json!({ "id": id, "status": state, "ext": ext })),
    )
        .into_response()
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
    ($($backend:ident: $conn:ty, $sync:ty, $json_sql:ty, $json_ddl:literal;)*) => {$(
        pub mod $backend {
            use super::*;

            pub type Pool = bb8::Pool<$conn>;
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

            #[derive(Debug, Clone, Queryable, Selectable, Identifiable, Insertable, Guarded)]
            #[diesel(table_name = service_orders)]
            pub struct Order {
                pub id: i64,
                #[occ(status)]
                pub status: OrderStatus,
                #[occ(json)]
                pub ext: Value,
                #[occ(version)]
                pub version: i64,
            }

            impl Order {
                fn response(&self, status: StatusCode) -> Response {
                    representation(status, self.id, self.status.name(), &self.ext, &Order::token_of(&self.version))
                }

                fn token_of(version: &i64) -> Token {
                    Token::Version(i128::from(*version))
                }
            }

            /// Creates the table (dropping an old one) and the library's tables, over one
            /// blocking connection (diesel's migration harness is blocking).
            pub fn setup(url: &str) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
                let conn = &mut <$sync as diesel::Connection>::establish(url)?;
                diesel_occ::migrations::run(conn)?;
                conn.batch_execute("DROP TABLE IF EXISTS service_orders")?;
                conn.batch_execute(concat!(
                    "CREATE TABLE service_orders (id BIGINT PRIMARY KEY NOT NULL, ",
                    "status VARCHAR(16) NOT NULL, ext ", $json_ddl, " NOT NULL, version BIGINT NOT NULL)"
                ))?;
                Ok(())
            }

            /// A bb8 pool of diesel-async connections to `url` (SQLite's wait up to 5 s for
            /// the write lock, as the blocking pools' do).
            pub async fn pool(url: &str) -> Result<Pool, Box<dyn std::error::Error + Send + Sync>> {
                let mut config = ManagerConfig::default();
                if stringify!($backend) == "sqlite" {
                    config.custom_setup = Box::new(|url| {
                        Box::pin(async move {
                            use diesel_async::{AsyncConnection, SimpleAsyncConnection};
                            let mut conn = <$conn>::establish(url).await?;
                            conn.batch_execute("PRAGMA busy_timeout = 5000; PRAGMA journal_mode = WAL")
                                .await
                                .map_err(diesel::ConnectionError::CouldntSetupConfiguration)?;
                            Ok(conn)
                        })
                    });
                }
                let manager = AsyncDieselConnectionManager::new_with_config(url, config);
                Ok(bb8::Pool::builder().max_size(10).build(manager).await?)
            }

            /// Runs for leadership of the nightly job under `label`; the job runs while this
            /// instance leads.
            pub fn campaign(pool: Pool, label: &str, timing: ElectionTiming) -> Result<AsyncCandidate, Error> {
                AsyncCandidate::start_with_job(AsyncLocks::new(pool), "orders-service", "nightly", label, timing, nightly_job)
            }

            pub fn router(pool: Pool) -> Router {
                Router::new()
                    .route("/orders/{id}", post(create).get(read).patch(patch))
                    .route("/orders/{id}/ship", post(ship))
                    .route("/orders/{id}/cancel", post(cancel))
                    .with_state(pool)
            }

            async fn create(State(pool): State<Pool>, Path(id): Path<i64>) -> Result<Response, Failure> {
                let conn = &mut *pool.checkout().await?;
                let order = Order { id, status: OrderStatus::Valid, ext: json!({}), version: 0 };
                diesel::insert_into(service_orders::table).values(&order).execute(conn).await?;
                Ok(order.response(StatusCode::CREATED))
            }

            async fn read(State(pool): State<Pool>, Path(id): Path<i64>, if_none_match: IfNoneMatch) -> Result<Response, Failure> {
                let order = load(&mut *pool.checkout().await?, id).await?;
                let token = Order::token_of(&order.version);
                if !if_none_match.is_new(Some(&token)) {
                    return Ok((StatusCode::NOT_MODIFIED, [(header::ETAG, EntityTag::of(&token).header_value())]).into_response());
                }
                Ok(order.response(StatusCode::OK))
            }

            async fn patch(
                State(pool): State<Pool>,
                Path(id): Path<i64>,
                if_match: IfMatch,
                headers: HeaderMap,
                body: Bytes,
            ) -> Result<Response, Failure> {
                let kind = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
                let patch: Value = serde_json::from_slice(&body).map_err(|e| {
                    Failure(Problem::from(&Error::InvalidPatch {
                        table: "service_orders",
                        key: id.to_string(),
                        column: "ext",
                        reason: format!("the body is not JSON: {e}"),
                    }))
                })?;
                let conn = &mut *pool.checkout().await?;
                let order = match (kind.as_str(), if_match.0.is_absent()) {
                    ("application/merge-patch+json", true) => {
                        // No precondition: merge into the latest version, retrying on
                        // conflicts; a merge never drops another writer's keys.
                        Order::merge_json(conn, &id, service_orders::ext, &patch, &policy()).await?.row
                    }
                    ("application/merge-patch+json", false) | ("application/json-patch+json", _) => {
                        let mut order = load(conn, id).await?;
                        // Only the version the client saw: a stale tag is 412 here, and a
                        // write in between makes the guarded update a conflict (412).
                        if_match.check(Some(&Order::token_of(&order.version)), true)?;
                        if kind == "application/merge-patch+json" {
                            json_patch::merge(&mut order.ext, &patch);
                        } else {
                            let operations: json_patch::Patch = serde_json::from_value(patch).map_err(|e| invalid(id, e.to_string()))?;
                            json_patch::patch(&mut order.ext, &operations).map_err(|e| invalid(id, e.to_string()))?;
                        }
                        order.version = Order::guarded_update_by_key(conn, &id, &order.version, service_orders::ext.eq(order.ext.clone())).await?;
                        order
                    }
                    (other, _) => {
                        return Ok((StatusCode::UNSUPPORTED_MEDIA_TYPE, format!("unsupported content type {other:?}: send application/merge-patch+json or application/json-patch+json")).into_response());
                    }
                };
                Ok(order.response(StatusCode::OK))
            }

            async fn ship(State(pool): State<Pool>, Path(id): Path<i64>) -> Result<Response, Failure> {
                transition(pool, id, OrderStatus::Shipped).await
            }

            async fn cancel(State(pool): State<Pool>, Path(id): Path<i64>) -> Result<Response, Failure> {
                transition(pool, id, OrderStatus::Cancelled).await
            }

            async fn transition(pool: Pool, id: i64, to: OrderStatus) -> Result<Response, Failure> {
                let conn = &mut *pool.checkout().await?;
                Order::transition_by_key(conn, &id, to, no_extra(), &policy()).await?;
                let order = load(conn, id).await?;
                tracing::info!(id, to = to.name(), "moved");
                Ok(order.response(StatusCode::OK))
            }

            async fn load(conn: &mut $conn, id: i64) -> Result<Order, Error> {
                let found = service_orders::table.find(id).select(Order::as_select()).first(conn).await.optional()?;
                found.ok_or(Error::NotFound { table: "service_orders", key: id.to_string() })
            }

            fn invalid(id: i64, reason: String) -> Failure {
                Failure::from(Error::InvalidPatch { table: "service_orders", key: id.to_string(), column: "ext", reason })
            }
        }
    )*};
}

orders_api! {
    sqlite: diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>, diesel::SqliteConnection, diesel::sql_types::Json, "TEXT";
    postgres: diesel_async::AsyncPgConnection, diesel::PgConnection, diesel::sql_types::Jsonb, "JSONB";
    mysql: diesel_async::AsyncMysqlConnection, diesel::MysqlConnection, diesel::sql_types::Json, "JSON";
}
