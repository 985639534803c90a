//! Learning a write's new token by reading it after the write, as decisions both drivers
//! share: whether the read needs a transaction of its own, whether it is sent, and what
//! its answer means.

#[cfg(any(feature = "mysql", feature = "sqlite"))]
use diesel::QueryResult;

/// The rows a `... RETURNING <token>` statement matched and the token of the first.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn returned<Tok>(tokens: Vec<Tok>) -> (usize, Option<Tok>) {
    (tokens.len(), tokens.into_iter().next())
}

/// The decisions of a token read after its write, for both drivers: whether the read
/// needs a transaction of its own, whether it is sent, and what its answer means.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReadBack {
    nests: bool,
    /// Read only after the write matched one row (a column of the row); else after any
    /// write that matched a row (the session's note, which also restores the caller's
    /// value).
    one_row: bool,
}

#[cfg(any(feature = "mysql", feature = "sqlite"))]
impl ReadBack {
    /// The session's note of the version set: no transaction, since no other writer can
    /// change it; read whenever the write matched a row (a key of several rows is
    /// refused, and the caller's last insert id is restored all the same).
    #[cfg(feature = "mysql")]
    pub(crate) const NOTE: ReadBack = ReadBack {
        nests: false,
        one_row: false,
    };

    /// A column of the row the write set. Inside a transaction the library opened
    /// (`own`), the two already go or stay together; elsewhere they take a savepoint (in
    /// the caller's transaction) or a transaction, so that no other writer comes between.
    /// A savepoint in the library's own would only add a statement a cluster's abort can
    /// fail in (a Galera node that aborted the transaction answers `SAVEPOINT ... does not
    /// exist`).
    pub(crate) fn after_write(own: bool, in_transaction: bool) -> ReadBack {
        ReadBack {
            nests: !(own && in_transaction),
            one_row: true,
        }
    }

    /// Whether the write and its read run in a transaction (or savepoint) of their own.
    pub(crate) fn nests(&self) -> bool {
        self.nests
    }

    /// Whether the read is sent after a write that matched `rows` rows.
    pub(crate) fn written(&self, rows: usize) -> bool {
        if self.one_row {
            rows == 1
        } else {
            rows > 0
        }
    }

    /// What the read of the column gave: the token of the one row written. A row that is
    /// gone right after this transaction wrote it: the server aborted the transaction under
    /// it (a Galera node, for a conflicting write from another node, whose reply to the
    /// write claimed success). Retryable: nothing of it stays.
    pub(crate) fn read<Tok>(&self, read: QueryResult<Tok>) -> QueryResult<(usize, Option<Tok>)> {
        match read {
            Ok(token) => Ok((1, Some(token))),
            Err(diesel::result::Error::NotFound) => Err(aborted_under_write()),
            Err(other) => Err(other),
        }
    }

    /// What the read of the session's note gave after a write that matched `rows`: the
    /// version of the one row written; for several (refused later) only the restore
    /// counted.
    #[cfg(feature = "mysql")]
    pub(crate) fn note<Tok: crate::guard::version::VersionNumber>(
        rows: usize,
        noted: QueryResult<crate::sql::statement::NotedVersion>,
    ) -> QueryResult<(usize, Option<Tok>)> {
        let noted = noted?.noted;
        match rows {
            1 => Tok::from_noted(noted)
                .map(|version| (1, Some(version)))
                .ok_or_else(|| {
                    diesel::result::Error::DeserializationError(
                        format!("the noted version {noted} does not fit the version's type").into(),
                    )
                }),
            rows => Ok((rows, None)),
        }
    }
}

/// The row a statement wrote a moment ago in this transaction is gone: the server aborted
/// the transaction under it (a Galera node, for a conflicting write from another node,
/// whose reply to the write claimed success). Retryable: nothing of it stays.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) fn aborted_under_write() -> diesel::result::Error {
    diesel::result::Error::DatabaseError(
        diesel::result::DatabaseErrorKind::SerializationFailure,
        Box::new(
            "the row just written is not there: the server aborted the transaction".to_string(),
        ),
    )
}

#[cfg(all(test, any(feature = "mysql", feature = "sqlite")))]
mod tests {
    use super::ReadBack;
    use diesel::result::{DatabaseErrorKind, Error as DieselError};

    #[test]
    fn a_column_is_read_in_a_transaction_of_its_own_unless_the_librarys_holds_the_write() {
        assert!(!ReadBack::after_write(true, true).nests());
        assert!(ReadBack::after_write(true, false).nests());
        assert!(
            ReadBack::after_write(false, true).nests(),
            "the caller's: a savepoint"
        );
        assert!(ReadBack::after_write(false, false).nests());
    }

    #[test]
    fn a_column_is_read_only_after_a_write_of_one_row() {
        let read_back = ReadBack::after_write(false, false);
        assert_eq!(
            [0, 1, 2].map(|rows| read_back.written(rows)),
            [false, true, false]
        );
    }

    #[test]
    fn a_row_gone_right_after_its_write_is_a_retryable_abort() {
        let read_back = ReadBack::after_write(true, true);
        assert_eq!(read_back.read(Ok(7_i64)), Ok((1, Some(7))));
        match read_back.read::<i64>(Err(DieselError::NotFound)) {
            Err(DieselError::DatabaseError(DatabaseErrorKind::SerializationFailure, _)) => {}
            other => panic!("{other:?}"),
        }
        let broken = read_back.read::<i64>(Err(DieselError::BrokenTransactionManager));
        assert!(matches!(broken, Err(DieselError::BrokenTransactionManager)));
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn the_note_is_read_after_any_write_that_matched_and_counts_for_one_row_only() {
        use crate::sql::statement::NotedVersion;
        let noted = || {
            Ok(NotedVersion {
                noted: 42,
                _restored: Some(9),
            })
        };
        assert_eq!(
            [0, 1, 2].map(|rows| ReadBack::NOTE.written(rows)),
            [false, true, true]
        );
        assert_eq!(ReadBack::note::<i64>(1, noted()), Ok((1, Some(42))));
        assert_eq!(ReadBack::note::<i64>(2, noted()), Ok((2, None)));
        let failed = ReadBack::note::<i64>(1, Err(DieselError::BrokenTransactionManager));
        assert!(matches!(failed, Err(DieselError::BrokenTransactionManager)));
    }
}
