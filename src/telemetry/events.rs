//! The events of the library's flows, each reported once, where the flow that both
//! drivers share decides it (the table of names is the module's doc).

// Each report has its facts for both facades; with one of them off, some go unused.
#![cfg_attr(
    not(all(feature = "tracing", feature = "metrics")),
    allow(unused_variables)
)]
// With neither facade, only the early returns are left.
#![cfg_attr(
    not(any(feature = "tracing", feature = "metrics")),
    allow(clippy::needless_return)
)]

use crate::error::{Conflict, Error};
#[cfg(feature = "locks")]
use crate::locks::lock::LockKey;
use crate::retry::RetryEvent;

/// A guarded write found the row changed since the caller read it.
#[inline]
pub(crate) fn conflict(conflict: &Conflict) {
    #[cfg(feature = "tracing")]
    tracing::event!(
        name: "diesel_occ.conflict",
        target: "diesel_occ",
        tracing::Level::DEBUG,
        db.collection.name = conflict.table,
        occ.key = %conflict.key,
        occ.expected = %conflict.expected,
        occ.current = %conflict.found,
        "the row changed since it was read"
    );
    #[cfg(feature = "metrics")]
    metrics::counter!("diesel_occ_conflicts_total", "db.collection.name" => conflict.table)
        .increment(1);
}

/// A retry policy runs an attempt of `operation` on `table` again after `retry.delay`.
#[inline]
pub(crate) fn retry((operation, table): (&'static str, &'static str), retry: &RetryEvent<'_>) {
    let reason = retry_reason(retry.error);
    #[cfg(feature = "tracing")]
    tracing::event!(
        name: "diesel_occ.retry",
        target: "diesel_occ",
        tracing::Level::DEBUG,
        db.operation = operation,
        db.collection.name = table,
        occ.attempt = retry.attempt,
        occ.reason = reason,
        occ.wait_us = retry.delay.as_micros() as u64,
        error = %retry.error,
        "attempt {} failed, retrying", retry.attempt
    );
    #[cfg(feature = "metrics")]
    {
        metrics::counter!(
            "diesel_occ_retries_total",
            "db.operation" => operation,
            "db.collection.name" => table,
            "occ.reason" => reason
        )
        .increment(1);
        metrics::histogram!("diesel_occ_retry_wait_seconds", "db.operation" => operation)
            .record(retry.delay);
    }
}

/// What a retry is for: the retry reason of a transient refusal, else the error's kind.
fn retry_reason(error: &Error) -> &'static str {
    use crate::error::RetryReason as R;
    match error {
        Error::Retryable { reason, .. } => match reason {
            R::SerializationFailure => "serialization_failure",
            R::Deadlock => "deadlock",
            R::LockTimeout => "lock_timeout",
            R::Busy => "busy",
            R::ConnectionLost => "connection_lost",
            R::NodeNotReady => "node_not_ready",
            R::ReadBehind => "read_behind",
            R::ReadOnly => "read_only",
        },
        other => other.kind(),
    }
}

/// A retry policy gave up on `operation` on `table` after `attempts`, the last one
/// failing with `last`: at `WARN`, with what it was about, since an operator's
/// subscriber does not show the call's span.
#[inline]
pub(crate) fn gave_up(
    (operation, table): (&'static str, &'static str),
    attempts: u32,
    last: &Error,
) {
    #[cfg(feature = "tracing")]
    tracing::event!(
        name: "diesel_occ.gave_up",
        target: "diesel_occ",
        tracing::Level::WARN,
        db.operation = operation,
        db.collection.name = table,
        occ.attempts = attempts,
        error = %last,
        "gave up on {operation} after {attempts} attempts"
    );
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "diesel_occ_retries_exhausted_total",
        "db.operation" => operation,
        "db.collection.name" => table
    )
    .increment(1);
}

/// A run of a retry policy for `operation` ended after `attempts` attempts, however it
/// ended.
#[inline]
pub(crate) fn attempts(operation: &'static str, attempts: u32) {
    #[cfg(feature = "metrics")]
    metrics::histogram!("diesel_occ_attempts", "db.operation" => operation).record(attempts);
}

/// The lock `key` was granted to this process with `fence`.
#[cfg(feature = "locks")]
#[inline]
pub(crate) fn lock_granted(key: &LockKey, fence: i64, ttl: std::time::Duration) {
    #[cfg(feature = "tracing")]
    tracing::event!(
        name: "diesel_occ.lock_granted",
        target: "diesel_occ",
        tracing::Level::DEBUG,
        occ.lock = %key.shown(),
        occ.fence = fence,
        occ.ttl_ms = ttl.as_millis() as u64,
        "lock granted"
    );
    #[cfg(feature = "metrics")]
    metrics::counter!("diesel_occ_lock_grants_total", "occ.lock" => key.name().to_owned())
        .increment(1);
}

/// The lock was held by another holder (labelled `holder`) until `until`.
#[cfg(feature = "locks")]
#[inline]
pub(crate) fn lock_busy(key: &LockKey, holder: Option<&str>, until: Option<&str>) {
    #[cfg(feature = "tracing")]
    tracing::event!(
        name: "diesel_occ.lock_busy",
        target: "diesel_occ",
        tracing::Level::DEBUG,
        occ.lock = %key.shown(),
        occ.holder = holder,
        occ.until = until,
        "lock held by another holder"
    );
    #[cfg(feature = "metrics")]
    metrics::counter!("diesel_occ_lock_busy_total", "occ.lock" => key.name().to_owned())
        .increment(1);
}

/// This process no longer holds the lock, for reason `why`.
#[cfg(feature = "locks")]
#[inline]
pub(crate) fn lock_lost(key: &LockKey, why: &str) {
    #[cfg(feature = "tracing")]
    tracing::event!(
        name: "diesel_occ.lock_lost",
        target: "diesel_occ",
        tracing::Level::WARN,
        occ.lock = %key.shown(),
        occ.why = why,
        "lock lost: {why}"
    );
    #[cfg(feature = "metrics")]
    metrics::counter!("diesel_occ_lock_losses_total", "occ.lock" => key.name().to_owned())
        .increment(1);
}

/// This process freed the lock it held with `fence`.
#[cfg(feature = "locks")]
#[inline]
pub(crate) fn lock_released(key: &LockKey, fence: i64) {
    #[cfg(feature = "tracing")]
    tracing::event!(
        name: "diesel_occ.lock_released",
        target: "diesel_occ",
        tracing::Level::DEBUG,
        occ.lock = %key.shown(),
        occ.fence = fence,
        "lock released"
    );
    #[cfg(feature = "metrics")]
    metrics::counter!("diesel_occ_lock_releases_total", "occ.lock" => key.name().to_owned())
        .increment(1);
}

/// What a candidate of the election on lock `key` reports.
#[cfg(feature = "locks")]
#[inline]
pub(crate) fn leadership(key: &LockKey, event: &crate::LeaderEvent) {
    use crate::LeaderEvent as E;
    let change = match event {
        E::Elected { .. } => "gained",
        E::Lost { .. } => "lost",
        E::SteppedDown | E::JobEnded { .. } => "ended",
    };
    #[cfg(feature = "tracing")]
    match event {
        E::Elected { fence } => tracing::event!(
            name: "diesel_occ.leadership_gained",
            target: "diesel_occ",
            tracing::Level::INFO,
            occ.election = %key.shown(),
            occ.fence = fence,
            "this process leads {}", key.shown()
        ),
        E::Lost { reason } => tracing::event!(
            name: "diesel_occ.leadership_lost",
            target: "diesel_occ",
            tracing::Level::WARN,
            occ.election = %key.shown(),
            occ.why = reason,
            "this process lost the lead of {}: {reason}", key.shown()
        ),
        E::SteppedDown => tracing::event!(
            name: "diesel_occ.leadership_ended",
            target: "diesel_occ",
            tracing::Level::INFO,
            occ.election = %key.shown(),
            occ.why = "stepped down",
            "this process stepped down from {}", key.shown()
        ),
        E::JobEnded { panic: None } => tracing::event!(
            name: "diesel_occ.leadership_ended",
            target: "diesel_occ",
            tracing::Level::INFO,
            occ.election = %key.shown(),
            occ.why = "the leader's job returned",
            "the leader's job of {} returned; the lock is freed", key.shown()
        ),
        E::JobEnded { panic: Some(panic) } => tracing::event!(
            name: "diesel_occ.leadership_ended",
            target: "diesel_occ",
            tracing::Level::WARN,
            occ.election = %key.shown(),
            occ.why = panic.as_str(),
            "the leader's job of {} panicked: {panic}; the lock is freed", key.shown()
        ),
    }
    #[cfg(feature = "metrics")]
    {
        // Each term ends once: a gauge moved by one per term stays right when elections of
        // one name on several resources (a leader per shard) run in one process.
        let leader = metrics::gauge!("diesel_occ_leader", "occ.election" => key.name().to_owned());
        if change == "gained" {
            leader.increment(1.0);
        } else {
            leader.decrement(1.0);
        }
        metrics::counter!(
            "diesel_occ_leadership_changes_total",
            "occ.election" => key.name().to_owned(),
            "occ.change" => change
        )
        .increment(1);
    }
    let _ = change;
}

/// A claim of `owner` took `rows` rows of `table`.
#[cfg(feature = "locks")]
#[inline]
pub(crate) fn claimed(table: &'static str, owner: &str, rows: usize) {
    // Nothing taken is nothing to report (an idle worker polls).
    if rows == 0 {
        return;
    }
    #[cfg(feature = "tracing")]
    tracing::event!(
        name: "diesel_occ.claimed",
        target: "diesel_occ",
        tracing::Level::DEBUG,
        db.collection.name = table,
        occ.owner = owner,
        occ.rows = rows,
        "claimed {rows} rows"
    );
    #[cfg(feature = "metrics")]
    metrics::counter!("diesel_occ_claimed_rows_total", "db.collection.name" => table)
        .increment(rows as u64);
}

/// A heartbeat of `owner` extended its claim of `rows` rows of `table`.
#[cfg(feature = "locks")]
#[inline]
pub(crate) fn claim_heartbeat(table: &'static str, owner: &str, rows: usize) {
    #[cfg(feature = "tracing")]
    tracing::event!(
        name: "diesel_occ.claim_heartbeat",
        target: "diesel_occ",
        tracing::Level::DEBUG,
        db.collection.name = table,
        occ.owner = owner,
        occ.rows = rows,
        "extended the claim of {rows} rows"
    );
    #[cfg(feature = "metrics")]
    metrics::counter!("diesel_occ_claim_heartbeats_total", "db.collection.name" => table)
        .increment(1);
}

/// A counted claim of `owner` parked `rows` rows of `table` that used up their attempts.
#[cfg(feature = "locks")]
#[inline]
pub(crate) fn parked(table: &'static str, owner: &str, rows: usize) {
    // Nothing taken is nothing to report (an idle worker polls).
    if rows == 0 {
        return;
    }
    #[cfg(feature = "tracing")]
    tracing::event!(
        name: "diesel_occ.parked",
        target: "diesel_occ",
        tracing::Level::WARN,
        db.collection.name = table,
        occ.owner = owner,
        occ.rows = rows,
        "parked {rows} rows that used up their attempts"
    );
    #[cfg(feature = "metrics")]
    metrics::counter!("diesel_occ_parked_rows_total", "db.collection.name" => table)
        .increment(rows as u64);
}
