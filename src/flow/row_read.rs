//! Reading one row by its key, and what the answer means: the row, [`Error::NotFound`],
//! [`Error::InvalidData`] naming the columns whose NULL or malformed value would make the
//! row unreadable, or the database's error. A locked read that finds nothing
//! ([`LockedRead`]) reads once more without the lock to tell a row another transaction
//! holds (`SKIP LOCKED`) from a missing one.
//!
//! Read-modify-write, work on a locked row and transitions by key with a hook read this
//! way, blocking and async; the drivers only send the reads.

use std::fmt::Debug;

use diesel::result::Error as DieselError;
use diesel::QueryResult;

use crate::error::{is_cut_short, with_sources, Error};

/// The row with `key` of `table` as read, or why there is none; `classify` judges a
/// database error on the reading connection, `suspects` names the columns an unreadable
/// row is blamed on.
pub(crate) fn judge_read<T>(
    table: &'static str,
    key: &dyn Debug,
    suspects: &str,
    read: QueryResult<Option<T>>,
    classify: impl FnOnce(DieselError) -> Error,
) -> Result<T, Error> {
    match read {
        Ok(Some(row)) => Ok(row),
        Ok(None) => Err(Error::NotFound {
            table,
            key: format!("{key:?}"),
        }),
        Err(DieselError::DeserializationError(cause)) if !is_cut_short(&*cause) => {
            Err(Error::InvalidData {
                table,
                column: suspects.to_string(),
                reason: format!("row {key:?} cannot be read: {}", with_sources(&*cause)),
            })
        }
        Err(e) => Err(classify(e)),
    }
}

/// Whether a read's error is for the driver to classify (the connection's or the
/// database's), not the row's own that [`judge_read`] names: the async driver's
/// classification is awaited before the judgement.
#[cfg(feature = "async")]
pub(crate) fn needs_classifying(error: &DieselError) -> bool {
    match error {
        DieselError::DeserializationError(cause) => is_cut_short(&**cause),
        _ => true,
    }
}

/// A read of one row with a row lock (`FOR UPDATE`, or `SKIP LOCKED` to refuse a held
/// row): send the locked read, feed it to [`locked`](Self::locked), and when that asks
/// for it send a plain read and feed it to [`unlocked`](Self::unlocked).
pub(crate) struct LockedRead<'a> {
    table: &'static str,
    key: &'a (dyn Debug + Sync),
    suspects: &'a str,
}

/// What a locked read needs next.
pub(crate) enum AfterLock<T> {
    /// The answer.
    Done(Result<T, Error>),
    /// The locked read found nothing: read the row without the lock, to tell a held row
    /// from a missing one.
    ReadUnlocked,
}

impl<'a> LockedRead<'a> {
    /// A locked read of the row with `key` of `table`, blaming `suspects` for a row that
    /// does not read as the entity.
    pub(crate) fn new(table: &'static str, key: &'a (dyn Debug + Sync), suspects: &'a str) -> Self {
        LockedRead {
            table,
            key,
            suspects,
        }
    }

    /// The locked read's answer.
    pub(crate) fn locked<T>(
        &self,
        read: QueryResult<Option<T>>,
        classify: impl FnOnce(DieselError) -> Error,
    ) -> AfterLock<T> {
        match read {
            Ok(None) => AfterLock::ReadUnlocked,
            read => AfterLock::Done(self.judge(read, classify)),
        }
    }

    /// The plain read's answer, after a locked read found nothing: a row that is there is
    /// held by another transaction ([`Error::LockHeld`]); else there is none.
    pub(crate) fn unlocked<T>(
        &self,
        read: QueryResult<Option<T>>,
        classify: impl FnOnce(DieselError) -> Error,
    ) -> Result<T, Error> {
        match read {
            Ok(Some(_)) => Err(Error::LockHeld {
                lock: format!("`{}` row {:?}", self.table, self.key),
                holder: None,
                until: None,
            }),
            read => self.judge(read, classify),
        }
    }

    fn judge<T>(
        &self,
        read: QueryResult<Option<T>>,
        classify: impl FnOnce(DieselError) -> Error,
    ) -> Result<T, Error> {
        judge_read(self.table, self.key, self.suspects, read, classify)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unclassified(e: DieselError) -> Error {
        Error::Database(e)
    }

    #[test]
    fn a_locked_read_that_finds_the_row_is_done() {
        let read = LockedRead::new("orders", &1_i64, "version");
        assert!(matches!(
            read.locked(Ok(Some(5)), unclassified),
            AfterLock::Done(Ok(5))
        ));
    }

    #[test]
    fn a_locked_read_that_finds_nothing_tells_held_from_missing() {
        let read = LockedRead::new("orders", &1_i64, "version");
        assert!(matches!(
            read.locked::<i64>(Ok(None), unclassified),
            AfterLock::ReadUnlocked
        ));
        let held = read.unlocked(Ok(Some(5)), unclassified).unwrap_err();
        assert!(
            matches!(&held, Error::LockHeld { lock, .. } if lock == "`orders` row 1"),
            "{held:?}"
        );
        let missing = read.unlocked::<i64>(Ok(None), unclassified).unwrap_err();
        assert!(
            matches!(&missing, Error::NotFound { table: "orders", key } if key == "1"),
            "{missing:?}"
        );
    }

    #[test]
    fn an_unreadable_row_blames_the_suspects_on_either_read() {
        let read = LockedRead::new("orders", &1_i64, "status (or version)");
        let cause = || DieselError::DeserializationError("unknown status `bogus`".into());
        for error in [
            match read.locked::<i64>(Err(cause()), unclassified) {
                AfterLock::Done(done) => done.unwrap_err(),
                AfterLock::ReadUnlocked => panic!("an error is an answer"),
            },
            read.unlocked::<i64>(Err(cause()), unclassified)
                .unwrap_err(),
        ] {
            assert!(
                matches!(&error, Error::InvalidData { column, reason, .. }
                    if column == "status (or version)" && reason.contains("unknown status `bogus`")),
                "{error:?}"
            );
        }
    }

    #[test]
    fn an_answer_cut_short_is_a_lost_connection_not_bad_data() {
        // What diesel-async reports when mysql_async got no result set for the read.
        let cut =
            || DieselError::DeserializationError(Box::new(diesel::result::UnexpectedEndOfRow));
        let read = LockedRead::new("orders", &1_i64, "version");
        let classify = |e| crate::flow::compare_and_set::classify_given(e, false, |_| None);
        let error = match read.locked::<i64>(Err(cut()), classify) {
            AfterLock::Done(done) => done.unwrap_err(),
            AfterLock::ReadUnlocked => panic!("an error is an answer"),
        };
        assert!(
            matches!(&error, Error::Ambiguous { source } if crate::error::connection_lost(source)),
            "{error:?}"
        );
        let inside = |e| crate::flow::compare_and_set::classify_given(e, true, |_| None);
        let error = judge_read::<i64>("orders", &1_i64, "version", Err(cut()), inside).unwrap_err();
        assert!(
            matches!(&error, Error::Database(source) if crate::error::connection_lost(source)
                && source.to_string().contains("without the rows the query owes")),
            "{error:?}"
        );
    }

    #[test]
    fn another_error_is_the_drivers_classification() {
        let read = LockedRead::new("orders", &1_i64, "version");
        let error = match read.locked::<i64>(Err(DieselError::NotFound), |_| Error::Retryable {
            reason: crate::RetryReason::Busy,
            source: DieselError::NotFound,
        }) {
            AfterLock::Done(done) => done.unwrap_err(),
            AfterLock::ReadUnlocked => panic!("an error is an answer"),
        };
        assert!(error.is_retryable(), "{error:?}");
    }
}
