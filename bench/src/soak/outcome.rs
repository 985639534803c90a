//! How a call's answer is written into the history: what it says about the row
//! ([`Ret`]), or that it says nothing for certain. Every error of the library has its
//! place here; a raw database error that is not a lost connection is counted apart, since
//! the library promises none.

use diesel::result::{DatabaseErrorKind, Error as DieselError};
use diesel_occ::Error;

use super::history::What;
use super::model::{Kind, Op, Ret, Row};

/// The history's line for an answer: a [`What::Return`] or a [`What::Unknown`].
/// `current` turns a conflict's current row (the backend's entity) into the model's.
pub fn judged(
    op: &Op,
    answer: Result<Ret, Error>,
    current: fn(&diesel_occ::Conflict) -> Option<Row>,
) -> What {
    let error = match answer {
        Ok(ret) => {
            return What::Return {
                ret,
                outcome: "ok".into(),
                error: None,
            }
        }
        Err(error) => error,
    };
    let text = Some(error.to_string());
    match error_ret(op, &error, current) {
        Ok((ret, outcome)) => What::Return {
            ret,
            outcome: outcome.into(),
            error: text,
        },
        Err(outcome) => What::Unknown {
            outcome,
            error: text,
        },
    }
}

/// The answer an error gives, with its kind; `Err(kind)` when it leaves the call's effect
/// unknown.
fn error_ret(
    op: &Op,
    error: &Error,
    current: fn(&diesel_occ::Conflict) -> Option<Row>,
) -> Result<(Ret, &'static str), String> {
    Ok(match error {
        Error::InvalidTransition(t) if t.unmet.is_some() => (Ret::Unmet, "unmet_condition"),
        Error::InvalidTransition(t) => (
            Ret::Invalid {
                status: t.from.clone(),
            },
            "invalid_transition",
        ),
        Error::LockHeld { .. } => (Ret::Held, "lock_held"),
        Error::LockLost { .. } => match op.kind() {
            Kind::Order => (Ret::ClaimLost, "claim_lost"),
            // A grant that came back too late to be believed: let go at once, best effort.
            _ if *op == Op::Acquire => (Ret::GrantedLate, "granted_late"),
            _ => (Ret::Lost, "lock_lost"),
        },
        Error::StaleFence { current, .. } => (Ret::Stale { current: *current }, "stale_fence"),
        Error::NotFound { .. } => (Ret::NotFound, "not_found"),
        Error::AlreadyExists { .. } => (Ret::AlreadyExists, "already_exists"),
        Error::Conflict(conflict) => match current(conflict) {
            Some(row) => (Ret::Conflict { current: row }, "conflict"),
            None => return Err("conflict_without_row".into()),
        },
        Error::Retryable { reason, .. } => (Ret::NothingWritten, retryable_kind(*reason)),
        Error::RetriesExhausted { .. } => (Ret::NothingWritten, "retries_exhausted"),
        Error::Pool(_) => (Ret::NothingWritten, "pool_timeout"),
        // A standby, or a primary still finishing its promotion, refused the statement.
        Error::ReadOnly { .. } => (Ret::NothingWritten, "read_only"),
        // Nothing was written; the soak fails the run all the same (nothing refuses here).
        Error::Refused { .. } => (Ret::NothingWritten, "refused"),
        Error::Ambiguous { .. } => return Err("ambiguous".into()),
        Error::Connection(_) => return Err("connect_failed".into()),
        Error::Database(e) if connection_died(e) => return Err("connection_lost".into()),
        other => return Err(format!("raw: {other}")),
    })
}

fn retryable_kind(reason: diesel_occ::RetryReason) -> &'static str {
    use diesel_occ::RetryReason::*;
    match reason {
        SerializationFailure => "retryable_serialization",
        Deadlock => "retryable_deadlock",
        LockTimeout => "retryable_lock_timeout",
        Busy => "retryable_busy",
        ConnectionLost => "retryable_connection_lost",
        NodeNotReady => "retryable_node_not_ready",
        ReadBehind => "retryable_read_behind",
        ReadOnly => "retryable_read_only",
        _ => "retryable_other",
    }
}

/// Whether a diesel error says the connection is gone (the effect of the call unknown).
pub fn connection_died(error: &DieselError) -> bool {
    match error {
        DieselError::DatabaseError(DatabaseErrorKind::ClosedConnection, _) => true,
        DieselError::DatabaseError(DatabaseErrorKind::UnableToSendCommand, _) => true,
        DieselError::DatabaseError(_, info) => {
            let m = info.message().to_ascii_lowercase();
            [
                "terminating connection",
                "server closed the connection",
                "connection to the server",
                "gone away",
                "lost connection",
                "connection was killed",
                "broken pipe",
                "connection reset",
                "no connection to the server",
                "input/output error",
                "connection closed",
                "error communicating with the server",
            ]
            .iter()
            .any(|t| m.contains(t))
        }
        DieselError::BrokenTransactionManager => true,
        _ => false,
    }
}

/// A load's answer as the model sees it.
pub fn loaded(row: Option<Row>) -> Ret {
    Ret::Loaded { row }
}
