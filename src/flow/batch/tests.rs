//! Every branch of the batch flow, fed by a scripted driver: each case lists the effects
//! the flow must answer and what the driver reports after each, then the outcome. No
//! database.

use diesel::result::{DatabaseErrorKind, Error as DieselError};

use super::{Batch, Effect};
use crate::error::{Conflict, Error, RetryReason, Token};
use crate::flow::batch::rows::{Pending, ROWS_PER_STATEMENT};
use crate::operation::batch::{BatchMode, BatchReport, RowOutcome};

diesel::table! {
    items (id) {
        id -> BigInt,
        version -> BigInt,
    }
}

#[derive(Debug, Clone, PartialEq, diesel::Queryable, diesel::Identifiable, crate::Guarded)]
#[diesel(table_name = items)]
struct Item {
    id: i64,
    #[occ(version)]
    version: i64,
}

/// A row's statement, named by its key.
type Statement = i64;

/// What the scripted driver reports after an effect.
enum Report {
    Checked(Result<(), Error>),
    Began(Result<(), Error>),
    SentRound(Result<Vec<(usize, Option<i64>)>, Error>),
    ReadMissed(Result<Vec<Item>, DieselError>),
    WroteRow(Result<Option<i64>, Error>),
    Committed(Result<(), DieselError>),
    RolledBack(Result<(), DieselError>),
}
use Report::*;

fn lost() -> DieselError {
    DieselError::DatabaseError(
        DatabaseErrorKind::ClosedConnection,
        Box::new("server closed the connection".to_string()),
    )
}

fn deadlock() -> Error {
    Error::Retryable {
        reason: RetryReason::Deadlock,
        source: DieselError::DatabaseError(
            DatabaseErrorKind::SerializationFailure,
            Box::new("deadlock detected".to_string()),
        ),
    }
}

fn conflict(key: i64) -> Error {
    Error::Conflict(Box::new(Conflict::new(
        "items",
        key.to_string(),
        Token::Version(0),
        Token::Version(1),
        Item {
            id: key,
            version: 1,
        },
    )))
}

fn not_found(key: i64) -> Error {
    Error::NotFound {
        table: "items",
        key: key.to_string(),
    }
}

/// Rows `keys`, each expected at version 0.
fn rows(keys: impl IntoIterator<Item = i64>) -> Vec<(Pending<Item>, Statement)> {
    keys.into_iter()
        .map(|key| (Pending::new(key, 0, 1), key))
        .collect()
}

/// A batch of updates of `rows` in `mode`, combined into rounds when `combine`.
fn updates(
    rows: Vec<(Pending<Item>, Statement)>,
    mode: BatchMode,
    nested: bool,
    combine: bool,
) -> Batch<Item, Statement, i64> {
    Batch::new("items", rows, mode, nested, |returned, next| {
        returned.unwrap_or(next)
    })
    .of_updates(combine)
}

/// Drives `flow` with `reports`, checking that it answers `effects` (the first is its
/// start, the last `Done`); the outcome.
fn drive(
    mut flow: Batch<Item, Statement, i64>,
    reports: Vec<Report>,
    effects: &[Effect<Statement, i64>],
) -> Result<BatchReport<i64>, Error> {
    assert_eq!(
        effects.len(),
        reports.len() + 1,
        "one report per effect but Done"
    );
    let mut effect = flow.start();
    for (i, report) in reports.into_iter().enumerate() {
        assert_eq!(effect, effects[i], "effect {i}");
        if let Effect::WriteRow(key) = effect {
            assert_eq!(flow.row(), (&key, &0), "the row under way");
        }
        effect = match report {
            Checked(checked) => flow.checked(checked),
            Began(began) => flow.began(began),
            SentRound(sent) => flow.sent_round(sent),
            ReadMissed(read) => flow.read_missed(read, Error::Database),
            WroteRow(wrote) => flow.wrote_row(wrote),
            Committed(committed) => flow.committed(committed),
            RolledBack(rolled_back) => flow.rolled_back(rolled_back),
        };
    }
    assert_eq!(effect, Effect::Done);
    flow.outcome()
}

fn outcomes(report: &BatchReport<i64>) -> Vec<String> {
    report
        .rows
        .iter()
        .map(|row| match row {
            RowOutcome::Written(token) => format!("written {token}"),
            RowOutcome::Conflict(c) => format!("conflict {}", c.key),
            RowOutcome::NotFound => "not found".to_string(),
            RowOutcome::Refused(_) => "refused".to_string(),
        })
        .collect()
}

#[test]
fn an_empty_batch_is_done_at_once() {
    let report = drive(
        updates(Vec::new(), BatchMode::AllOrNothing, false, false),
        vec![],
        &[Effect::Done],
    )
    .unwrap();
    assert!(report.rows.is_empty() && report.applied);
}

#[test]
fn a_partial_batch_reports_each_row_and_keeps_the_written_ones() {
    let report = drive(
        updates(rows([1, 2, 3]), BatchMode::Partial, false, false),
        vec![
            Checked(Ok(())),
            WroteRow(Ok(None)),
            WroteRow(Err(conflict(2))),
            WroteRow(Err(not_found(3))),
        ],
        &[
            Effect::CheckPrecision,
            Effect::WriteRow(1),
            Effect::WriteRow(2),
            Effect::WriteRow(3),
            Effect::Done,
        ],
    )
    .unwrap();
    assert_eq!(outcomes(&report), ["written 1", "conflict 2", "not found"]);
    assert!(report.applied);
}

#[test]
fn a_token_read_back_is_the_written_rows_token() {
    let report = drive(
        updates(rows([1]), BatchMode::Partial, false, false),
        vec![Checked(Ok(())), WroteRow(Ok(Some(7)))],
        &[Effect::CheckPrecision, Effect::WriteRow(1), Effect::Done],
    )
    .unwrap();
    assert_eq!(outcomes(&report), ["written 7"]);
}

#[test]
fn an_all_or_nothing_batch_with_a_miss_rolls_back() {
    let report = drive(
        updates(rows([1, 2]), BatchMode::AllOrNothing, false, false),
        vec![
            Checked(Ok(())),
            Began(Ok(())),
            WroteRow(Ok(None)),
            WroteRow(Err(conflict(2))),
            RolledBack(Ok(())),
        ],
        &[
            Effect::CheckPrecision,
            Effect::Begin,
            Effect::WriteRow(1),
            Effect::WriteRow(2),
            Effect::Rollback,
            Effect::Done,
        ],
    )
    .unwrap();
    assert_eq!(outcomes(&report), ["written 1", "conflict 2"]);
    assert!(!report.applied, "the written row was undone");
}

#[test]
fn an_all_or_nothing_batch_of_written_rows_commits() {
    let report = drive(
        updates(rows([1, 2]), BatchMode::AllOrNothing, false, false),
        vec![
            Checked(Ok(())),
            Began(Ok(())),
            WroteRow(Ok(None)),
            WroteRow(Ok(None)),
            Committed(Ok(())),
        ],
        &[
            Effect::CheckPrecision,
            Effect::Begin,
            Effect::WriteRow(1),
            Effect::WriteRow(2),
            Effect::Commit,
            Effect::Done,
        ],
    )
    .unwrap();
    assert!(report.applied);
}

#[test]
fn the_rows_of_an_all_or_nothing_batch_run_in_its_own_transaction() {
    let mut flow = updates(rows([1]), BatchMode::AllOrNothing, false, false);
    assert_eq!(flow.start(), Effect::CheckPrecision);
    assert!(!flow.own_transaction());
    assert_eq!(flow.checked(Ok(())), Effect::Begin);
    assert_eq!(flow.began(Ok(())), Effect::WriteRow(1));
    assert!(
        flow.own_transaction(),
        "no savepoint per statement inside it"
    );
    assert_eq!(flow.wrote_row(Ok(None)), Effect::Commit);
    assert_eq!(flow.committed(Ok(())), Effect::Done);
    assert!(!flow.own_transaction());

    let mut partial = updates(rows([1]), BatchMode::Partial, true, false);
    partial.start();
    assert_eq!(partial.checked(Ok(())), Effect::WriteRow(1));
    assert!(
        !partial.own_transaction(),
        "the caller's transaction is not the library's"
    );
}

#[test]
fn a_lost_commit_is_ambiguous_and_nested_it_is_the_databases_error() {
    for (nested, ambiguous) in [(false, true), (true, false)] {
        let outcome = drive(
            updates(rows([1]), BatchMode::AllOrNothing, nested, false),
            vec![
                Checked(Ok(())),
                Began(Ok(())),
                WroteRow(Ok(None)),
                Committed(Err(lost())),
            ],
            &[
                Effect::CheckPrecision,
                Effect::Begin,
                Effect::WriteRow(1),
                Effect::Commit,
                Effect::Done,
            ],
        );
        match outcome {
            Err(Error::Ambiguous { .. }) if ambiguous => {}
            Err(Error::Database(_)) if !ambiguous => {}
            other => panic!("nested {nested}: {other:?}"),
        }
    }
}

#[test]
fn a_database_error_ends_the_batch_after_rolling_back_its_transaction() {
    let outcome = drive(
        updates(rows([1, 2, 3]), BatchMode::AllOrNothing, false, false),
        vec![
            Checked(Ok(())),
            Began(Ok(())),
            WroteRow(Ok(None)),
            WroteRow(Err(deadlock())),
            RolledBack(Ok(())),
        ],
        &[
            Effect::CheckPrecision,
            Effect::Begin,
            Effect::WriteRow(1),
            Effect::WriteRow(2),
            Effect::Rollback,
            Effect::Done,
        ],
    );
    assert!(
        matches!(
            outcome,
            Err(Error::Retryable {
                reason: RetryReason::Deadlock,
                ..
            })
        ),
        "{outcome:?}"
    );
}

#[test]
fn a_connection_lost_before_commit_rolled_everything_back() {
    let outcome = drive(
        updates(rows([1, 2]), BatchMode::AllOrNothing, false, false),
        vec![
            Checked(Ok(())),
            Began(Ok(())),
            WroteRow(Err(Error::Ambiguous { source: lost() })),
            RolledBack(Err(lost())),
        ],
        &[
            Effect::CheckPrecision,
            Effect::Begin,
            Effect::WriteRow(1),
            Effect::Rollback,
            Effect::Done,
        ],
    );
    assert!(
        matches!(outcome, Err(Error::Database(_))),
        "nothing can have landed: {outcome:?}"
    );
}

#[test]
fn a_database_error_ends_a_partial_batch_at_once() {
    let outcome = drive(
        updates(rows([1, 2, 3]), BatchMode::Partial, false, false),
        vec![
            Checked(Ok(())),
            WroteRow(Ok(None)),
            WroteRow(Err(deadlock())),
        ],
        &[
            Effect::CheckPrecision,
            Effect::WriteRow(1),
            Effect::WriteRow(2),
            Effect::Done,
        ],
    );
    assert!(
        matches!(outcome, Err(Error::Retryable { .. })),
        "{outcome:?}"
    );
}

#[test]
fn a_failed_check_or_begin_ends_the_batch_with_nothing_sent() {
    let refused = Error::InvalidData {
        table: "items",
        column: "at".into(),
        reason: "stores whole seconds".into(),
    };
    let outcome = drive(
        updates(rows([1]), BatchMode::AllOrNothing, false, false),
        vec![Checked(Err(refused))],
        &[Effect::CheckPrecision, Effect::Done],
    );
    assert!(
        matches!(outcome, Err(Error::InvalidData { .. })),
        "{outcome:?}"
    );

    let outcome = drive(
        updates(rows([1]), BatchMode::AllOrNothing, false, false),
        vec![Checked(Ok(())), Began(Err(deadlock()))],
        &[Effect::CheckPrecision, Effect::Begin, Effect::Done],
    );
    assert!(
        matches!(outcome, Err(Error::Retryable { .. })),
        "{outcome:?}"
    );
}

#[test]
fn a_connection_lost_at_begin_wrote_nothing() {
    let outcome = drive(
        updates(rows([1]), BatchMode::AllOrNothing, false, false),
        vec![
            Checked(Ok(())),
            Began(Err(Error::Ambiguous { source: lost() })),
        ],
        &[Effect::CheckPrecision, Effect::Begin, Effect::Done],
    );
    assert!(matches!(outcome, Err(Error::Database(_))), "{outcome:?}");
}

#[test]
fn a_failed_rollback_after_a_miss_is_the_databases_error() {
    let outcome = drive(
        updates(rows([1]), BatchMode::AllOrNothing, false, false),
        vec![
            Checked(Ok(())),
            Began(Ok(())),
            WroteRow(Err(not_found(1))),
            RolledBack(Err(lost())),
        ],
        &[
            Effect::CheckPrecision,
            Effect::Begin,
            Effect::WriteRow(1),
            Effect::Rollback,
            Effect::Done,
        ],
    );
    assert!(matches!(outcome, Err(Error::Database(_))), "{outcome:?}");
}

#[test]
fn deletes_write_row_by_row_without_a_precision_check() {
    let flow = Batch::new("items", rows([1, 2]), BatchMode::Partial, false, |_, _| 0);
    let report = drive(
        flow,
        vec![WroteRow(Ok(None)), WroteRow(Err(conflict(2)))],
        &[Effect::WriteRow(1), Effect::WriteRow(2), Effect::Done],
    )
    .unwrap();
    assert_eq!(outcomes(&report), ["written 0", "conflict 2"]);
}

#[test]
fn combined_rounds_hold_at_most_the_statement_limit_and_read_their_misses() {
    let count = ROWS_PER_STATEMENT as i64 + 1;
    let missed = 500;
    let first: Vec<i64> = (1..count).collect();
    // Every row of the first round but `missed` was written.
    let written = (0..ROWS_PER_STATEMENT)
        .filter(|&i| first[i] != missed)
        .map(|i| (i, None))
        .collect();
    let report = drive(
        updates(rows(1..=count), BatchMode::Partial, false, true),
        vec![
            Checked(Ok(())),
            SentRound(Ok(written)),
            ReadMissed(Ok(vec![Item {
                id: missed,
                version: 1,
            }])),
            SentRound(Ok(vec![(0, Some(9))])),
        ],
        &[
            Effect::CheckPrecision,
            Effect::SendRound(first),
            Effect::ReadMissed(vec![missed]),
            Effect::SendRound(vec![count]),
            Effect::Done,
        ],
    )
    .unwrap();
    let outcomes = outcomes(&report);
    assert_eq!(outcomes.len(), count as usize);
    assert_eq!(outcomes[missed as usize - 1], format!("conflict {missed}"));
    assert_eq!(outcomes[0], "written 1");
    assert_eq!(
        outcomes[count as usize - 1],
        "written 9",
        "the token read back"
    );
}

#[test]
fn a_key_that_comes_again_waits_for_the_next_round() {
    let report = drive(
        updates(rows([1, 2, 1]), BatchMode::Partial, false, true),
        vec![
            Checked(Ok(())),
            SentRound(Ok(vec![(0, None), (1, None)])),
            // The repeated row, read at 0 again, missed: the first write moved it.
            SentRound(Ok(vec![])),
            ReadMissed(Ok(vec![Item { id: 1, version: 1 }])),
        ],
        &[
            Effect::CheckPrecision,
            Effect::SendRound(vec![1, 2]),
            Effect::SendRound(vec![1]),
            Effect::ReadMissed(vec![1]),
            Effect::Done,
        ],
    )
    .unwrap();
    assert_eq!(outcomes(&report), ["written 1", "written 1", "conflict 1"]);
}

#[test]
fn a_round_that_wrote_a_row_twice_names_the_key_that_is_not_unique() {
    let outcome = drive(
        updates(rows([1, 2]), BatchMode::AllOrNothing, false, true),
        vec![
            Checked(Ok(())),
            Began(Ok(())),
            SentRound(Ok(vec![(0, None), (0, None), (1, None)])),
            RolledBack(Ok(())),
        ],
        &[
            Effect::CheckPrecision,
            Effect::Begin,
            Effect::SendRound(vec![1, 2]),
            Effect::Rollback,
            Effect::Done,
        ],
    );
    match outcome {
        Err(Error::KeyNotUnique { key, rows: 2, .. }) => assert_eq!(key, "1"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn missed_rows_that_cannot_be_read_are_invalid_data_naming_the_guard() {
    let unreadable = DieselError::DeserializationError("not a number".into());
    let outcome = drive(
        updates(rows([1]), BatchMode::Partial, false, true),
        vec![
            Checked(Ok(())),
            SentRound(Ok(vec![])),
            ReadMissed(Err(unreadable)),
        ],
        &[
            Effect::CheckPrecision,
            Effect::SendRound(vec![1]),
            Effect::ReadMissed(vec![1]),
            Effect::Done,
        ],
    );
    match outcome {
        Err(Error::InvalidData { column, .. }) => assert_eq!(column, "version"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_missed_row_that_is_gone_is_not_found() {
    let report = drive(
        updates(rows([1]), BatchMode::Partial, false, true),
        vec![
            Checked(Ok(())),
            SentRound(Ok(vec![])),
            ReadMissed(Ok(vec![])),
        ],
        &[
            Effect::CheckPrecision,
            Effect::SendRound(vec![1]),
            Effect::ReadMissed(vec![1]),
            Effect::Done,
        ],
    )
    .unwrap();
    assert_eq!(outcomes(&report), ["not found"]);
}
