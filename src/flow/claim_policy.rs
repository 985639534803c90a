//! The claims' retry policy: claims, heartbeats and ends of claims run again after a
//! transient failure.
//!
//! Workers taking rows from one queue deadlock now and then on MySQL: InnoDB locks the
//! entries of the state index as rows move between states, in the order each statement
//! meets them. None of these operations runs code of the caller's, so running one again
//! is always safe; each runs again under the default [`RetryPolicy`] while it fails for
//! a transient reason (a deadlock, a serialization failure, a busy database). Inside a
//! transaction of the caller's it runs once: a deadlock or serialization failure ends the
//! caller's whole attempt (MySQL rolls the transaction back, and a snapshot that went
//! stale stays stale), so only the caller can run it again.

use std::sync::LazyLock;

use crate::retry::{RetryPolicy, Run};

/// The policy of a claim operation outside the caller's transaction.
static AGAIN: LazyLock<RetryPolicy> = LazyLock::new(RetryPolicy::default);

/// The policy of one inside it.
static ONCE: LazyLock<RetryPolicy> = LazyLock::new(RetryPolicy::never);

/// A run of the policy of a claim operation on a connection that is (or is not) inside
/// the caller's transaction.
pub(crate) fn claim_run(in_callers_transaction: bool) -> Run<'static> {
    let run = if in_callers_transaction {
        ONCE.start()
    } else {
        AGAIN.start()
    };
    // Reported for all claim operations alike: each attempt is a call of its own, which
    // names the operation and the table.
    run.of("claims", "")
}
