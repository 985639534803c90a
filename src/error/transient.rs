//! Which database errors a fresh attempt can fix, judged from the error alone (each
//! backend may ask its server for more: `OccBackend::retry_reason`).

use diesel::result::{DatabaseErrorKind, Error as DieselError};

use super::RetryReason;

/// Why `error` can be fixed by a fresh attempt, judged without asking the server: by
/// diesel's error kind, and for kinds diesel does not map, by the servers' own fixed
/// English message texts, compared whole (never searched for words: messages carry user
/// data such as duplicate values, constraint names and trigger texts).
///
/// What this recognises in any server language: PostgreSQL serialization failures
/// (`40001`) and MySQL deadlocks (`1213`), which diesel maps to a kind. What needs the
/// English text: PostgreSQL deadlocks (`40P01`) and lock timeouts or `NOWAIT` failures
/// (`55P03`), MySQL lock wait timeouts (`1205`, but see
/// [`OccBackend::retry_reason`](crate::OccBackend::retry_reason)), a Galera node that is
/// not synced (`1047`), and SQLite busy errors (SQLite's messages are never translated).
pub(crate) fn retry_reason_of(error: &DieselError) -> Option<RetryReason> {
    let DieselError::DatabaseError(kind, info) = error else {
        return None;
    };
    let message = info.message();
    match kind {
        DatabaseErrorKind::SerializationFailure => Some(
            if message == "Deadlock found when trying to get lock; try restarting transaction" {
                RetryReason::Deadlock
            } else {
                RetryReason::SerializationFailure
            },
        ),
        DatabaseErrorKind::Unknown => retry_reason_of_message(message),
        // Unique, foreign-key, check and not-null violations, read-only transactions,
        // closed connections: the same statement fails the same way again.
        _ => None,
    }
}

fn retry_reason_of_message(message: &str) -> Option<RetryReason> {
    let quoted_name_after = |prefix: &str| {
        message
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.len() >= 2 && rest.starts_with('"') && rest.ends_with('"'))
    };
    match message {
        // PostgreSQL 40P01
        "deadlock detected" => Some(RetryReason::Deadlock),
        // PostgreSQL 55P03 from lock_timeout
        "canceling statement due to lock timeout" => Some(RetryReason::LockTimeout),
        // MySQL / MariaDB 1205
        "Lock wait timeout exceeded; try restarting transaction" => Some(RetryReason::LockTimeout),
        // MySQL / MariaDB 1213, as clients that keep the text only report it (diesel-async)
        "Deadlock found when trying to get lock; try restarting transaction" => {
            Some(RetryReason::Deadlock)
        }
        // MariaDB 1969 (`max_statement_time`), text only as above
        "Query execution was interrupted (max_statement_time exceeded)" => {
            Some(RetryReason::LockTimeout)
        }
        // MariaDB 1047 (`ER_UNKNOWN_COM_ERROR`) from a Galera node that is not synced
        "WSREP has not yet prepared node for application use" => Some(RetryReason::NodeNotReady),
        // MariaDB 1180 from a Galera node that lost the primary component during a commit
        "Error while appending streaming replication fragment\
         (provider status: Not connected to Primary Component)" => Some(RetryReason::NodeNotReady),
        // SQLITE_BUSY, SQLITE_LOCKED
        "database is locked" | "database table is locked" => Some(RetryReason::Busy),
        // PostgreSQL 55P03 from NOWAIT: the quoted part is a relation name from the schema.
        _ if quoted_name_after("could not obtain lock on row in relation ")
            || quoted_name_after("could not obtain lock on relation ") =>
        {
            Some(RetryReason::LockTimeout)
        }
        _ if message.starts_with("database table is locked: ") => Some(RetryReason::Busy),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(kind: DatabaseErrorKind, message: &str) -> Option<RetryReason> {
        retry_reason_of(&DieselError::DatabaseError(
            kind,
            Box::new(message.to_string()),
        ))
    }

    #[test]
    fn server_texts_compared_whole_are_transient() {
        use DatabaseErrorKind::Unknown;
        use RetryReason::*;
        assert_eq!(
            reason(
                DatabaseErrorKind::SerializationFailure,
                "could not serialize access"
            ),
            Some(SerializationFailure)
        );
        assert_eq!(
            reason(
                DatabaseErrorKind::SerializationFailure,
                "Deadlock found when trying to get lock; try restarting transaction"
            ),
            Some(Deadlock)
        );
        assert_eq!(reason(Unknown, "deadlock detected"), Some(Deadlock));
        assert_eq!(
            reason(
                Unknown,
                "WSREP has not yet prepared node for application use"
            ),
            Some(NodeNotReady)
        );
        assert_eq!(
            reason(Unknown, "canceling statement due to lock timeout"),
            Some(LockTimeout)
        );
        assert_eq!(
            reason(
                Unknown,
                "could not obtain lock on row in relation \"orders\""
            ),
            Some(LockTimeout)
        );
        assert_eq!(
            reason(
                Unknown,
                "Lock wait timeout exceeded; try restarting transaction"
            ),
            Some(LockTimeout)
        );
        assert_eq!(reason(Unknown, "database is locked"), Some(Busy));
    }

    #[test]
    fn words_inside_other_messages_are_not_transient() {
        use DatabaseErrorKind::*;
        for message in [
            "Duplicate entry 'deadlock' for key 'note'",
            "Duplicate entry 'database is locked' for key 'note'",
            "new row for relation \"orders\" violates check constraint \"no deadlock notes\"",
            "refused by deadlock policy",
            "canceling statement due to statement timeout",
            "deadlock detected!",
        ] {
            assert_eq!(reason(Unknown, message), None, "{message}");
        }
        assert_eq!(reason(UniqueViolation, "deadlock detected"), None);
        assert_eq!(reason(CheckViolation, "database is locked"), None);
        assert_eq!(reason(ForeignKeyViolation, "deadlock detected"), None);
    }
}
