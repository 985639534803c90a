//! What the library reports while it works: [`tracing`] spans and events with the
//! `tracing` feature, [`metrics`] counters, gauges and histograms with the `metrics`
//! feature. Both are the ecosystem's facades: nothing is recorded until the application
//! installs a subscriber (`tracing-subscriber`, `tracing-opentelemetry`, ...) or a
//! recorder (`metrics-exporter-prometheus`, ...), and without one a call costs a check
//! of a cached flag per report (the benchmark's `W1` figures, with and without a
//! subscriber, are in `BENCHMARKS.md`).
//!
//! # Spans
//!
//! Each write of the library (guarded writes, read-modify-writes, JSON merges,
//! transitions, claims, batches, fenced writes, work on a locked row) and each step of a
//! lock runs in a span named `diesel_occ`, at `DEBUG`, target `diesel_occ`, with the
//! fields of OpenTelemetry's database conventions where they fit. Plain reads (`load`,
//! `find_by_key`) are diesel's own queries and have no span.
//!
//! | field | value |
//! |---|---|
//! | `db.system` | `postgresql`, `mysql` or `sqlite` |
//! | `db.operation` | the library's operation: `update`, `save`, `save_changed`, `delete`, `insert`, `upsert`, `write_by_key` (excluded fields, touches), `batch`, `bulk_update`, `modify`, `edit_json` (merges and patches read, changed and written), `merge_json_in_place`, `guarded_operation`, `transition`, `transition_by_key`, `locked`, `claim`, `claim_counted`, `extend_claim`, `finish_claim`, `finish_claims`, `write_fenced`, `lock.acquire`, `lock.renew`, `lock.release` |
//! | `db.collection.name` | the table (`occ_locks` for locks) |
//! | `occ.key` | the row's key, or the lock's `name/resource` (holder tokens are never reported) |
//! | `occ.outcome` | `ok`, or the error's [`kind`](crate::Error::kind), recorded when the call ends |
//!
//! The events below happen inside these spans, so a subscriber shows which call met them.
//! A read-modify-write's attempts are calls of their own inside its span (the
//! `save` or `update` of each attempt), and are counted as such in
//! `diesel_occ_calls_total`.
//!
//! # Events
//!
//! Target `diesel_occ`; each has a `name` (the first column) and a message. What the rows
//! say (a conflict, a held lock) is `DEBUG`; what an operator must look at (a retry loop
//! that gave up, a lost lock or leadership, a parked row, a call that failed for the
//! database's or the network's sake) is `WARN`; leadership gained is `INFO`.
//!
//! | name | level | fields |
//! |---|---|---|
//! | `diesel_occ.conflict` | DEBUG | `db.collection.name`, `occ.key`, `occ.expected`, `occ.current` (tokens) |
//! | `diesel_occ.retry` | DEBUG | `occ.attempt` (the one that failed), `occ.reason`, `occ.wait_us`, `error` |
//! | `diesel_occ.gave_up` | WARN | `occ.attempts`, `error` (the last attempt's) |
//! | `diesel_occ.call_failed` | DEBUG, or WARN for trouble | `occ.outcome`, `error` (every call ending in an error other than a conflict: a refused transition, a missing row, a held lock, a lost connection, ...) |
//! | `diesel_occ.lock_granted` | DEBUG | `occ.lock`, `occ.fence`, `occ.ttl_ms` |
//! | `diesel_occ.lock_busy` | DEBUG | `occ.lock`, `occ.holder` (its label), `occ.until` |
//! | `diesel_occ.lock_lost` | WARN | `occ.lock`, `occ.why` (names the new holder after a takeover) |
//! | `diesel_occ.lock_released` | DEBUG | `occ.lock`, `occ.fence` |
//! | `diesel_occ.leadership_gained` | INFO | `occ.election`, `occ.fence` |
//! | `diesel_occ.leadership_lost` | WARN | `occ.election`, `occ.why` |
//! | `diesel_occ.leadership_ended` | INFO | `occ.election`, `occ.why` (stepped down, job ended) |
//! | `diesel_occ.claimed` | DEBUG | `db.collection.name`, `occ.owner`, `occ.rows` |
//! | `diesel_occ.claim_heartbeat` | DEBUG | `db.collection.name`, `occ.owner`, `occ.rows` |
//! | `diesel_occ.parked` | WARN | `db.collection.name`, `occ.owner`, `occ.rows` (rows that used up their attempts) |
//!
//! # Metrics
//!
//! Names as a Prometheus dashboard expects them (`_total` counters, `_seconds`
//! histograms); labels use the span's field names (an exporter to Prometheus writes
//! `db.collection.name` as `db_collection_name`). Label values are bounded: a lock is
//! labelled by its name, never its resource.
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `diesel_occ_calls_total` | counter | `db.system`, `db.operation`, `db.collection.name`, `occ.outcome` |
//! | `diesel_occ_call_duration_seconds` | histogram | `db.system`, `db.operation`, `db.collection.name` |
//! | `diesel_occ_conflicts_total` | counter | `db.collection.name` |
//! | `diesel_occ_retries_total` | counter | `occ.reason` |
//! | `diesel_occ_retry_wait_seconds` | histogram | |
//! | `diesel_occ_retries_exhausted_total` | counter | |
//! | `diesel_occ_attempts` | histogram | (attempts per run of a retry policy) |
//! | `diesel_occ_lock_grants_total` | counter | `occ.lock` |
//! | `diesel_occ_lock_busy_total` | counter | `occ.lock` |
//! | `diesel_occ_lock_losses_total` | counter | `occ.lock` |
//! | `diesel_occ_lock_releases_total` | counter | `occ.lock` |
//! | `diesel_occ_leader` | gauge | `occ.election` (1 while this process leads) |
//! | `diesel_occ_leadership_changes_total` | counter | `occ.election`, `occ.change` (`gained`, `lost`, `ended`) |
//! | `diesel_occ_claimed_rows_total` | counter | `db.collection.name` |
//! | `diesel_occ_claim_heartbeats_total` | counter | `db.collection.name` |
//! | `diesel_occ_parked_rows_total` | counter | `db.collection.name` |

mod call;
mod events;

pub(crate) use call::Call;
pub(crate) use events::*;
