//! What the library reports while it works: [`tracing`] spans and events with the
//! `tracing` feature (on by default), [`metrics`] counters, gauges and histograms with the
//! `metrics` feature. Both are the ecosystem's facades: nothing is recorded until the
//! application installs a subscriber (`tracing-subscriber`, `tracing-opentelemetry`, ...)
//! or a recorder (`metrics-exporter-prometheus`, ...). Without a subscriber a report of
//! `tracing` costs the check of a cached flag; a report of `metrics` without a recorder
//! still builds its key (a few per cent on the fastest operations, hence opt-in). The
//! benchmark's W1-telemetry figures are in `BENCHMARKS.md`.
//!
//! # Spans
//!
//! Each write of the library (guarded writes, read-modify-writes, JSON merges,
//! transitions, claims, batches, fenced writes, work on a locked row) and each step of a
//! lock runs in a span named `diesel_occ`, at `DEBUG`, target `diesel_occ`, with the
//! fields of OpenTelemetry's database conventions where they fit. Plain reads (`load`,
//! `find_by_key`) are diesel's own queries and have no span. Where a call continues on a
//! task or a thread of its own (a lock's acquisition and release, async SQLite,
//! `with_connection`), its span is still a child of the caller's.
//!
//! | field | value |
//! |---|---|
//! | `db.system` | `postgresql`, `mysql` (MariaDB too) or `sqlite` |
//! | `db.operation` | the library's operation: `update`, `save`, `save_changed`, `delete`, `insert`, `upsert`, `write_by_key` (excluded fields, touches), `batch`, `bulk_update`, `modify`, `edit_json` (merges and patches read, changed and written), `merge_json_in_place`, `guarded_operation`, `transition`, `transition_by_key`, `locked`, `claim`, `claim_counted`, `extend_claim`, `finish_claim`, `finish_claims`, `write_fenced`, `lock.acquire`, `lock.renew`, `lock.release` |
//! | `db.collection.name` | the table (`occ_locks` for locks) |
//! | `occ.key` | the row's key, or the lock's `name/resource` (holder tokens are never reported) |
//! | `occ.outcome` | `ok`, `cancelled` (the call's future was dropped), `error` (the caller's own error, from its closure), or the library error's [`kind`](crate::Error::kind), recorded when the call ends |
//! | `otel.name`, `otel.kind`, `otel.status_code`, `error.type` | for `tracing-opentelemetry`: `"<operation> <table>"`, `client`, `ERROR` and the outcome when the call failed |
//!
//! The events below happen inside these spans. A read-modify-write's attempts are calls
//! of their own inside its span (the `save` or `update` of each attempt), and are counted
//! as such in `diesel_occ_calls_total`; so are an upsert's insert and the single ends of
//! `finish_claims`.
//!
//! # Events
//!
//! Target `diesel_occ`; each has a `name` (the first column) and a message. What the rows
//! say (a conflict, a held lock, a refused transition) is `DEBUG`; what an operator must
//! look at (a retry loop that gave up, a lost lock or leadership, a parked row, a leader's
//! job that panicked, a call that failed for the database's or the network's sake) is
//! `WARN`; leadership gained or given up is `INFO`. The `WARN` events name their
//! operation and table themselves, since an operator's subscriber does not show the
//! `DEBUG` spans.
//!
//! | name | level | fields |
//! |---|---|---|
//! | `diesel_occ.conflict` | DEBUG | `db.collection.name`, `occ.key`, `occ.expected`, `occ.current` (tokens) |
//! | `diesel_occ.retry` | DEBUG | `db.operation`, `db.collection.name`, `occ.attempt` (the one that failed), `occ.reason`, `occ.wait_us`, `error` |
//! | `diesel_occ.gave_up` | WARN | `db.operation`, `db.collection.name`, `occ.attempts`, `error` (the last attempt's) |
//! | `diesel_occ.call_failed` | DEBUG, or WARN for trouble | `db.operation`, `db.collection.name`, `occ.key`, `occ.outcome`, `error`: every call that ended in an error no other event reports (not a conflict, a retry loop that gave up, or a lock step's held or lost lock) |
//! | `diesel_occ.lock_granted` | DEBUG | `occ.lock`, `occ.fence`, `occ.ttl_ms` |
//! | `diesel_occ.lock_busy` | DEBUG | `occ.lock`, `occ.holder` (its label), `occ.until` |
//! | `diesel_occ.lock_lost` | WARN | `occ.lock`, `occ.why` (names the new holder after a takeover); once per grant, whichever of the renewal, the keep-alive or the release finds it |
//! | `diesel_occ.lock_released` | DEBUG | `occ.lock`, `occ.fence` |
//! | `diesel_occ.leadership_gained` | INFO | `occ.election`, `occ.fence` |
//! | `diesel_occ.leadership_lost` | WARN | `occ.election`, `occ.why` |
//! | `diesel_occ.leadership_ended` | INFO (WARN when the job panicked) | `occ.election`, `occ.why` (stepped down, the job returned or panicked) |
//! | `diesel_occ.claimed` | DEBUG | `db.collection.name`, `occ.owner`, `occ.rows` |
//! | `diesel_occ.claim_heartbeat` | DEBUG | `db.collection.name`, `occ.owner`, `occ.rows` |
//! | `diesel_occ.parked` | WARN | `db.collection.name`, `occ.owner`, `occ.rows` (rows that used up their attempts) |
//!
//! # Metrics
//!
//! Names as a Prometheus dashboard expects them (`_total` counters, `_seconds`
//! histograms); labels use the span's field names (an exporter to Prometheus writes
//! `db.collection.name` as `db_collection_name`). Label values come from the schema and
//! the library, except a lock's or an election's name, which is the application's: keep
//! those names few (the resource, often an id, is never a label).
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `diesel_occ_calls_total` | counter | `db.system`, `db.operation`, `db.collection.name`, `occ.outcome` |
//! | `diesel_occ_call_duration_seconds` | histogram | `db.system`, `db.operation`, `db.collection.name` |
//! | `diesel_occ_conflicts_total` | counter | `db.collection.name` |
//! | `diesel_occ_retries_total` | counter | `db.operation`, `db.collection.name`, `occ.reason` |
//! | `diesel_occ_retry_wait_seconds` | histogram | `db.operation` |
//! | `diesel_occ_retries_exhausted_total` | counter | `db.operation`, `db.collection.name` |
//! | `diesel_occ_attempts` | histogram | `db.operation` (attempts per run of a retry policy: `modify`, `edit_json`, `transition_by_key`, `claims` for every claim, heartbeat and end, `retry_policy` for `RetryPolicy::run`) |
//! | `diesel_occ_lock_grants_total` | counter | `occ.lock` |
//! | `diesel_occ_lock_busy_total` | counter | `occ.lock` (every refused try: a waiting `lock` polls, a follower campaigns every retry period) |
//! | `diesel_occ_lock_losses_total` | counter | `occ.lock` |
//! | `diesel_occ_lock_releases_total` | counter | `occ.lock` |
//! | `diesel_occ_leader` | gauge | `occ.election` (the terms this process leads now: 1 while it leads) |
//! | `diesel_occ_leadership_changes_total` | counter | `occ.election`, `occ.change` (`gained`, `lost`, `ended`) |
//! | `diesel_occ_claimed_rows_total` | counter | `db.collection.name` |
//! | `diesel_occ_claim_heartbeats_total` | counter | `db.collection.name` |
//! | `diesel_occ_parked_rows_total` | counter | `db.collection.name` |

mod call;
mod events;
#[cfg(feature = "tokio")]
mod parent;

pub(crate) use call::Call;
pub(crate) use events::*;
#[cfg(feature = "tokio")]
pub(crate) use parent::Parent;
