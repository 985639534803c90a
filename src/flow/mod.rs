//! The library's multi-step operations, each written once as a value that does no I/O.
//!
//! A flow is fed what its last step returned and answers the next effect to perform
//! (begin a transaction, read a row, run the caller's change, commit, roll back, pause)
//! or that it is done. The blocking driver (diesel's `Connection`) and the async driver
//! (diesel-async's `AsyncConnection`) only perform the effects, so the two paths cannot
//! take different steps, and every branch of a flow is unit-tested by feeding it results,
//! without a database. What a statement's error is (retryable or not) is read by each
//! driver from its client, by one judgement per backend (`OccBackend::retry_reason`):
//! MySQL's error number is asked of the server on both paths.
//!
//! Layering: flows use what lies below them (`error`, `retry`, `connect`'s judgements of
//! a backend's answers, `sql`, `guard`); the drivers (`write`, `json`, `status`, `locks`,
//! `asynchronous`) use the flows; nothing here names a connection type or anything above.
//! The pieces every driver shares sit here too: the compare-and-set write and the
//! judgement of its answer, and the explanations of a miss.

pub(crate) mod batch;
#[cfg(feature = "locks")]
pub(crate) mod claim_lost;
#[cfg(feature = "locks")]
pub(crate) mod claim_policy;
pub(crate) mod compare_and_set;
#[cfg(feature = "locks")]
pub(crate) mod finish_claims;
mod hot_rows;
#[cfg(feature = "locks")]
pub(crate) mod leader_term;
#[cfg(feature = "locks")]
pub(crate) mod lock_transaction;
pub(crate) mod miss;
pub(crate) mod read_back;
pub(crate) mod read_modify_write;
pub(crate) mod row_read;
