//! Every branch of the read-modify-write flow, fed by a scripted driver: each case lists
//! what the driver reports after each effect, the effects the flow must answer, and the
//! outcome. No database, no sleeping.

use std::time::Duration;

use diesel::result::{DatabaseErrorKind, Error as DieselError};

use super::{Effect, ReadModifyWrite};
use crate::error::{Conflict, Error, RetryReason, Token};
use crate::retry::{Contention, RetryPolicy, Stop};
use crate::sql::statement::RowLock;

/// The caller's own error.
#[derive(Debug, PartialEq)]
enum Caller {
    AlreadyCancelled,
    Occ(String),
}

impl From<Error> for Caller {
    fn from(e: Error) -> Self {
        Caller::Occ(format!("{e:?}"))
    }
}

/// What the scripted driver reports after an effect.
enum Report {
    Began(Result<(), Error>),
    Read(diesel::QueryResult<Option<i64>>),
    Changed(Result<i64, Stop<Caller>>),
    Committed(Result<(), DieselError>),
    RolledBack,
    Paused,
}
use Report::*;

fn db_error(kind: DatabaseErrorKind, message: &str) -> DieselError {
    DieselError::DatabaseError(kind, Box::new(message.to_string()))
}

fn lost() -> DieselError {
    db_error(
        DatabaseErrorKind::ClosedConnection,
        "server closed the connection",
    )
}

fn conflict() -> Error {
    Error::Conflict(Box::new(Conflict::new(
        "orders",
        "1".into(),
        Token::Version(1),
        Token::Version(2),
        2_i64,
    )))
}

/// A policy with no real waits (every pause is at most 1 ms), optimistic unless a case
/// asks for the row memory, and at most `attempts` attempts.
fn policy(attempts: u32) -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(attempts)
        .first_delay(Duration::from_micros(1))
        .max_delay(Duration::from_millis(1))
        .contention(Contention::Optimistic)
}

/// Drives a flow on `key` with `reports`, checking that it answers `effects` (the first
/// one is its start); the outcome.
fn drive(
    policy: &RetryPolicy,
    nested: bool,
    fresh_per_attempt: bool,
    key: i64,
    reports: Vec<Report>,
    effects: &[Effect],
) -> Result<(i64, u32), Caller> {
    let mut flow = ReadModifyWrite::<i64, i64, Caller>::new(
        policy,
        nested,
        fresh_per_attempt,
        "orders",
        &key,
        "version",
    );
    let mut seen = vec![flow.start()];
    for report in reports {
        let next = match report {
            Began(begun) => flow.began(begun),
            Read(read) => flow.read(read, Error::Database),
            Changed(changed) => {
                assert_eq!(*flow.row(), key * 10, "the change gets the row read");
                flow.changed(changed)
            }
            Committed(committed) => flow.committed(committed),
            RolledBack => flow.rolled_back(),
            Paused => flow.paused(),
        };
        seen.push(match next {
            Effect::Pause(wait) => {
                assert!(wait <= Duration::from_millis(1), "pause {wait:?}");
                Effect::Pause(Duration::ZERO)
            }
            other => other,
        });
    }
    assert_eq!(seen, effects, "effects");
    flow.outcome().map_err(Stop::into_error)
}

const PAUSE: Effect = Effect::Pause(Duration::ZERO);
use Effect::{Begin, Change, Commit, Done, Read as ReadRow, Rollback};
const PLAIN: Effect = ReadRow(RowLock::None);

#[test]
fn one_clean_attempt_commits_and_counts_one() {
    let outcome = drive(
        &policy(5),
        false,
        false,
        1,
        vec![
            Began(Ok(())),
            Read(Ok(Some(10))),
            Changed(Ok(11)),
            Committed(Ok(())),
        ],
        &[Begin, PLAIN, Change, Commit, Done],
    );
    assert_eq!(outcome, Ok((11, 1)));
}

#[test]
fn a_conflict_rolls_back_pauses_and_reads_again() {
    let outcome = drive(
        &policy(5),
        false,
        false,
        1,
        vec![
            Began(Ok(())),
            Read(Ok(Some(10))),
            Changed(Err(Stop::Occ(conflict()))),
            RolledBack,
            Paused,
            Began(Ok(())),
            Read(Ok(Some(10))),
            Changed(Ok(12)),
            Committed(Ok(())),
        ],
        &[
            Begin, PLAIN, Change, Rollback, PAUSE, Begin, PLAIN, Change, Commit, Done,
        ],
    );
    assert_eq!(outcome, Ok((12, 2)));
}

#[test]
fn a_retry_reads_with_the_row_lock_when_contention_locks() {
    let policy = policy(5).contention(Contention::LockWhenContended {
        hot_for: Duration::from_secs(60),
    });
    // A key no other test marks hot.
    let key = 9_117;
    let outcome = drive(
        &policy,
        false,
        false,
        key,
        vec![
            Began(Ok(())),
            Read(Ok(Some(key * 10))),
            Changed(Err(Stop::Occ(conflict()))),
            RolledBack,
            Paused,
            Began(Ok(())),
            Read(Ok(Some(key * 10))),
            Changed(Ok(1)),
            Committed(Ok(())),
        ],
        &[
            Begin,
            PLAIN,
            Change,
            Rollback,
            PAUSE,
            Begin,
            ReadRow(RowLock::ForUpdate),
            Change,
            Commit,
            Done,
        ],
    );
    assert_eq!(outcome, Ok((1, 2)));
    // The conflict marked the row: the next call locks from its first read.
    let outcome = drive(
        &policy,
        false,
        false,
        key,
        vec![
            Began(Ok(())),
            Read(Ok(Some(key * 10))),
            Changed(Ok(2)),
            Committed(Ok(())),
        ],
        &[Begin, ReadRow(RowLock::ForUpdate), Change, Commit, Done],
    );
    assert_eq!(outcome, Ok((2, 1)));
}

#[test]
fn a_missing_row_is_not_found_and_never_retried() {
    let outcome = drive(
        &policy(5),
        false,
        false,
        1,
        vec![Began(Ok(())), Read(Ok(None)), RolledBack],
        &[Begin, PLAIN, Rollback, Done],
    );
    let Err(Caller::Occ(error)) = outcome else {
        panic!("{outcome:?}")
    };
    assert!(error.starts_with("NotFound"), "{error}");
    assert!(error.contains("key: \"1\""), "{error}");
}

#[test]
fn an_unreadable_row_names_the_suspect_columns() {
    let cause = DieselError::DeserializationError("NULL in a non-null column".into());
    let outcome = drive(
        &policy(5),
        false,
        false,
        1,
        vec![Began(Ok(())), Read(Err(cause)), RolledBack],
        &[Begin, PLAIN, Rollback, Done],
    );
    let Err(Caller::Occ(error)) = outcome else {
        panic!("{outcome:?}")
    };
    assert!(error.starts_with("InvalidData"), "{error}");
    assert!(error.contains("column: \"version\""), "{error}");
    assert!(error.contains("NULL in a non-null column"), "{error}");
}

#[test]
fn the_callers_own_error_stops_at_once_unchanged() {
    let outcome = drive(
        &policy(5),
        false,
        false,
        1,
        vec![
            Began(Ok(())),
            Read(Ok(Some(10))),
            Changed(Err(Stop::Caller(Caller::AlreadyCancelled))),
            RolledBack,
        ],
        &[Begin, PLAIN, Change, Rollback, Done],
    );
    assert_eq!(outcome, Err(Caller::AlreadyCancelled));
}

#[test]
fn a_connection_lost_at_commit_is_ambiguous_and_never_retried() {
    for fresh_per_attempt in [false, true] {
        let outcome = drive(
            &policy(5),
            false,
            fresh_per_attempt,
            1,
            vec![
                Began(Ok(())),
                Read(Ok(Some(10))),
                Changed(Ok(11)),
                Committed(Err(lost())),
            ],
            &[Begin, PLAIN, Change, Commit, Done],
        );
        let Err(Caller::Occ(error)) = outcome else {
            panic!("{outcome:?}")
        };
        assert!(error.starts_with("Ambiguous"), "{error}");
    }
}

#[test]
fn a_conflict_reported_at_commit_rolled_back_and_is_retried() {
    for kind in [
        DatabaseErrorKind::SerializationFailure,
        DatabaseErrorKind::Unknown,
    ] {
        let message = "Deadlock found when trying to get lock; try restarting transaction";
        let outcome = drive(
            &policy(5),
            false,
            false,
            1,
            vec![
                Began(Ok(())),
                Read(Ok(Some(10))),
                Changed(Ok(11)),
                Committed(Err(db_error(kind, message))),
                Paused,
                Began(Ok(())),
                Read(Ok(Some(10))),
                Changed(Ok(12)),
                Committed(Ok(())),
            ],
            &[
                Begin, PLAIN, Change, Commit, PAUSE, Begin, PLAIN, Change, Commit, Done,
            ],
        );
        assert_eq!(outcome, Ok((12, 2)), "{kind:?}");
    }
}

#[test]
fn a_busy_database_at_commit_rolled_back_and_is_retried() {
    let outcome = drive(
        &policy(5),
        false,
        false,
        1,
        vec![
            Began(Ok(())),
            Read(Ok(Some(10))),
            Changed(Ok(11)),
            Committed(Err(db_error(
                DatabaseErrorKind::Unknown,
                "database is locked",
            ))),
            Paused,
            Began(Ok(())),
            Read(Ok(Some(10))),
            Changed(Ok(12)),
            Committed(Ok(())),
        ],
        &[
            Begin, PLAIN, Change, Commit, PAUSE, Begin, PLAIN, Change, Commit, Done,
        ],
    );
    assert_eq!(outcome, Ok((12, 2)));
}

#[test]
fn a_timeout_at_commit_may_have_landed_and_is_not_retried() {
    let timeout = "Lock wait timeout exceeded; try restarting transaction";
    let outcome = drive(
        &policy(5),
        false,
        false,
        1,
        vec![
            Began(Ok(())),
            Read(Ok(Some(10))),
            Changed(Ok(11)),
            Committed(Err(db_error(DatabaseErrorKind::Unknown, timeout))),
        ],
        &[Begin, PLAIN, Change, Commit, Done],
    );
    let Err(Caller::Occ(error)) = outcome else {
        panic!("{outcome:?}")
    };
    assert!(error.starts_with("Database"), "{error}");
}

#[test]
fn inside_the_callers_transaction_a_conflict_at_release_comes_back_retryable_for_the_caller() {
    // A Galera abort reported when the savepoint is released: the caller's own retry of
    // its whole transaction can get past it.
    let deadlock = "Deadlock found when trying to get lock; try restarting transaction";
    let outcome = drive(
        &policy(5),
        true,
        false,
        1,
        vec![
            Began(Ok(())),
            Read(Ok(Some(10))),
            Changed(Ok(11)),
            Committed(Err(db_error(DatabaseErrorKind::Unknown, deadlock))),
        ],
        &[Begin, PLAIN, Change, Commit, Done],
    );
    let Err(Caller::Occ(error)) = outcome else {
        panic!("{outcome:?}")
    };
    assert!(error.starts_with("Retryable"), "{error}");
}

#[test]
fn another_failed_commit_is_the_databases_error() {
    let outcome = drive(
        &policy(5),
        false,
        false,
        1,
        vec![
            Began(Ok(())),
            Read(Ok(Some(10))),
            Changed(Ok(11)),
            Committed(Err(db_error(DatabaseErrorKind::Unknown, "disk full"))),
        ],
        &[Begin, PLAIN, Change, Commit, Done],
    );
    let Err(Caller::Occ(error)) = outcome else {
        panic!("{outcome:?}")
    };
    assert!(error.starts_with("Database"), "{error}");
}

#[test]
fn a_connection_lost_before_commit_wrote_nothing_and_retries_only_on_a_fresh_connection() {
    // One connection for every attempt: the same dead connection cannot retry.
    let outcome = drive(
        &policy(5),
        false,
        false,
        1,
        vec![
            Began(Ok(())),
            Read(Ok(Some(10))),
            Changed(Err(Stop::Occ(Error::Ambiguous { source: lost() }))),
            RolledBack,
        ],
        &[Begin, PLAIN, Change, Rollback, Done],
    );
    let Err(Caller::Occ(error)) = outcome else {
        panic!("{outcome:?}")
    };
    assert!(
        error.starts_with("Database"),
        "not ambiguous: nothing committed: {error}"
    );
    // A connection per attempt: the next one runs.
    let outcome = drive(
        &policy(5),
        false,
        true,
        1,
        vec![
            Began(Ok(())),
            Read(Ok(Some(10))),
            Changed(Err(Stop::Occ(Error::Ambiguous { source: lost() }))),
            RolledBack,
            Paused,
            Began(Ok(())),
            Read(Ok(Some(10))),
            Changed(Ok(11)),
            Committed(Ok(())),
        ],
        &[
            Begin, PLAIN, Change, Rollback, PAUSE, Begin, PLAIN, Change, Commit, Done,
        ],
    );
    assert_eq!(outcome, Ok((11, 2)));
}

#[test]
fn a_connection_that_fails_to_begin_is_retried_only_when_fresh() {
    let failed_begin = || Began(Err(Error::Ambiguous { source: lost() }));
    let outcome = drive(
        &policy(5),
        false,
        true,
        1,
        vec![
            failed_begin(),
            Paused,
            Began(Ok(())),
            Read(Ok(Some(10))),
            Changed(Ok(11)),
            Committed(Ok(())),
        ],
        &[Begin, PAUSE, Begin, PLAIN, Change, Commit, Done],
    );
    assert_eq!(outcome, Ok((11, 2)));
    let outcome = drive(
        &policy(5),
        false,
        false,
        1,
        vec![failed_begin()],
        &[Begin, Done],
    );
    let Err(Caller::Occ(error)) = outcome else {
        panic!("{outcome:?}")
    };
    assert!(
        error.starts_with("Database"),
        "a failed BEGIN wrote nothing: {error}"
    );
}

#[test]
fn a_busy_database_at_begin_is_retried() {
    let busy = || {
        Began(Err(Error::Retryable {
            reason: RetryReason::Busy,
            source: db_error(DatabaseErrorKind::Unknown, "database is locked"),
        }))
    };
    let outcome = drive(
        &policy(5),
        false,
        false,
        1,
        vec![
            busy(),
            Paused,
            Began(Ok(())),
            Read(Ok(Some(10))),
            Changed(Ok(11)),
            Committed(Ok(())),
        ],
        &[Begin, PAUSE, Begin, PLAIN, Change, Commit, Done],
    );
    assert_eq!(outcome, Ok((11, 2)));
}

#[test]
fn the_attempt_bound_gives_up_with_the_last_conflict() {
    let conflicted = || {
        [
            Began(Ok(())),
            Read(Ok(Some(10))),
            Changed(Err(Stop::Occ(conflict()))),
            RolledBack,
        ]
    };
    let mut reports: Vec<Report> = conflicted().into_iter().collect();
    reports.push(Paused);
    reports.extend(conflicted());
    let outcome = drive(
        &policy(2),
        false,
        false,
        1,
        reports,
        &[
            Begin, PLAIN, Change, Rollback, PAUSE, Begin, PLAIN, Change, Rollback, Done,
        ],
    );
    let Err(Caller::Occ(error)) = outcome else {
        panic!("{outcome:?}")
    };
    assert!(
        error.starts_with("RetriesExhausted { attempts: 2"),
        "{error}"
    );
    assert!(error.contains("Conflict"), "{error}");
}

#[test]
fn inside_the_callers_transaction_one_attempt_and_the_conflict_as_it_is() {
    let outcome = drive(
        &policy(5),
        true,
        false,
        1,
        vec![
            Began(Ok(())),
            Read(Ok(Some(10))),
            Changed(Err(Stop::Occ(conflict()))),
            RolledBack,
        ],
        &[Begin, PLAIN, Change, Rollback, Done],
    );
    let Err(Caller::Occ(error)) = outcome else {
        panic!("{outcome:?}")
    };
    assert!(error.starts_with("Conflict"), "{error}");
}

#[test]
fn inside_the_callers_transaction_a_failed_release_is_not_judged_as_a_commit() {
    // Releasing a savepoint commits nothing: a lost connection there is no ambiguity of
    // the library's (the caller's own COMMIT decides).
    let outcome = drive(
        &policy(5),
        true,
        false,
        1,
        vec![
            Began(Ok(())),
            Read(Ok(Some(10))),
            Changed(Ok(11)),
            Committed(Err(lost())),
        ],
        &[Begin, PLAIN, Change, Commit, Done],
    );
    let Err(Caller::Occ(error)) = outcome else {
        panic!("{outcome:?}")
    };
    assert!(error.starts_with("Database"), "{error}");
}

#[test]
#[should_panic(expected = "fed out of order")]
fn a_driver_that_skips_a_step_is_caught() {
    let key = 1_i64;
    let policy = policy(1);
    let mut flow =
        ReadModifyWrite::<i64, i64, Caller>::new(&policy, false, false, "orders", &key, "v");
    flow.start();
    flow.changed(Ok(1));
}

#[test]
fn a_read_only_refusal_is_retried_on_a_new_connection_only_where_one_may_reach_the_primary() {
    let read_only = || {
        Stop::Occ(Error::ReadOnly {
            source: db_error(
                DatabaseErrorKind::ReadOnlyTransaction,
                "cannot execute UPDATE in a read-only transaction",
            ),
        })
    };
    let key = 1_i64;
    // (a connection per attempt, the backend's reconnect may reach the primary) -> retried
    for (fresh, may_reach, retried) in [
        (true, true, true),
        (false, true, false),
        (true, false, false),
    ] {
        let policy = policy(5);
        let mut flow =
            ReadModifyWrite::<i64, i64, Caller>::new(&policy, false, fresh, "orders", &key, "v")
                .reconnecting_on_read_only(may_reach);
        flow.start();
        flow.began(Ok(()));
        flow.read(Ok(Some(10)), Error::Database);
        flow.changed(Err(read_only()));
        let next = flow.rolled_back();
        assert_eq!(
            flow.connection_unfit(),
            retried,
            "discarded ({fresh}, {may_reach})"
        );
        assert!(!flow.connection_unfit(), "asked once per attempt");
        if !retried {
            assert_eq!(next, Done, "({fresh}, {may_reach})");
            let Err(Caller::Occ(error)) = flow.outcome().map_err(Stop::into_error) else {
                panic!("an error")
            };
            assert!(error.starts_with("ReadOnly"), "{error}");
            continue;
        }
        assert!(matches!(next, Effect::Pause(_)), "{next:?}");
        assert_eq!(flow.paused(), Begin);
        flow.began(Ok(()));
        flow.read(Ok(Some(10)), Error::Database);
        flow.changed(Ok(11));
        assert_eq!(flow.committed(Ok(())), Done);
        assert!(
            !flow.connection_unfit(),
            "a clean attempt keeps its connection"
        );
        assert_eq!(flow.outcome().map_err(Stop::into_error), Ok((11, 2)));
    }
    // A server that stays read-only ends at the policy's bound, the reason named.
    let policy = policy(2);
    let mut flow =
        ReadModifyWrite::<i64, i64, Caller>::new(&policy, false, true, "orders", &key, "v")
            .reconnecting_on_read_only(true);
    flow.start();
    for attempt in 1..=2 {
        flow.began(Ok(()));
        flow.read(Ok(Some(10)), Error::Database);
        flow.changed(Err(read_only()));
        let next = flow.rolled_back();
        assert!(flow.connection_unfit());
        if attempt == 1 {
            flow.paused();
        } else {
            assert_eq!(next, Done);
        }
    }
    let Err(Caller::Occ(error)) = flow.outcome().map_err(Stop::into_error) else {
        panic!("an error")
    };
    assert!(
        error.starts_with("RetriesExhausted")
            && error.contains("last: ReadOnly")
            && !error.contains("Retryable"),
        "the last error is the refusal itself: {error}"
    );
    // One attempt (the policy's, or inside the caller's transaction): the refusal itself;
    // inside the caller's transaction the connection is the caller's, and kept.
    for (attempts, nested) in [(1, false), (5, true)] {
        let once = RetryPolicy::default().max_attempts(attempts);
        let mut flow =
            ReadModifyWrite::<i64, i64, Caller>::new(&once, nested, true, "orders", &key, "v")
                .reconnecting_on_read_only(true);
        flow.start();
        flow.began(Ok(()));
        flow.read(Ok(Some(10)), Error::Database);
        flow.changed(Err(read_only()));
        assert_eq!(flow.rolled_back(), Done);
        assert_eq!(flow.connection_unfit(), !nested, "({attempts}, {nested})");
        let Err(Caller::Occ(error)) = flow.outcome().map_err(Stop::into_error) else {
            panic!("an error")
        };
        assert!(
            error.starts_with("ReadOnly"),
            "({attempts}, {nested}): {error}"
        );
    }
}
