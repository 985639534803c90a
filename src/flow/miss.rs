//! Why a guarded write matched fewer rows than it must, judged from the row as it is
//! now: the explanations both drivers complete after reading that row.

use diesel::result::Error as DieselError;

use crate::error::{Conflict, Error};
use crate::guard::{GuardKind, Guarded, TokenOf};

/// A write on an entity's row matched nothing: the latest row, read by key, says why.
/// Gone is [`Error::NotFound`]; holding another token than the one expected,
/// [`Error::Conflict`] with it; for a write that advances whatever token the row holds, a
/// token at its end ([`Error::VersionOverflow`]); else [`Error::Refused`]: nobody else
/// won, the database ignored the write. A row that cannot be read is
/// [`Error::InvalidData`].
pub(crate) struct RowMoved<'k, T: Guarded> {
    key: &'k T::Key,
    expected: Option<&'k TokenOf<T>>,
    at_end: fn(&TokenOf<T>) -> bool,
    state: Option<&'static str>,
}

impl<'k, T: Guarded> RowMoved<'k, T> {
    /// A write that expected the row to hold `expected`.
    pub(crate) fn expecting(key: &'k T::Key, expected: &'k TokenOf<T>) -> Self {
        RowMoved {
            key,
            expected: Some(expected),
            at_end: |_| false,
            state: None,
        }
    }

    /// A write that took the row with any token and left the token alone.
    pub(crate) fn any(key: &'k T::Key) -> Self {
        RowMoved {
            key,
            expected: None,
            at_end: |_| false,
            state: None,
        }
    }

    /// A write that takes the row with any token and advances it in SQL, leaving out a
    /// row whose token `at_end` says cannot advance.
    pub(crate) fn advancing_any(key: &'k T::Key, at_end: fn(&TokenOf<T>) -> bool) -> Self {
        RowMoved {
            key,
            expected: None,
            at_end,
            state: None,
        }
    }

    /// A save that required the row to be in the saved copy's `state` (`None` for an
    /// entity without a status, or a write that is not a save).
    pub(crate) fn in_state(self, state: Option<&'static str>) -> Self {
        RowMoved { state, ..self }
    }

    /// The key, for explanations built on this one.
    pub(crate) fn key(&self) -> &'k T::Key {
        self.key
    }

    /// Whether `current` holds the token this write expected (always, for a write that
    /// expected none).
    pub(crate) fn holds_token_of(&self, current: &T) -> bool {
        self.expected
            .is_none_or(|expected| current.token() == *expected)
    }

    /// Why the write missed, as the drivers complete it: [`given_in`](Self::given_in),
    /// except that a row whose token is older than the copy's (a token that only grows
    /// went back) is left to the server's nature ([`Explanation::AskIfBehind`]).
    pub(crate) fn explained(self, table: &'static str, current: Option<T>) -> Explanation {
        match (self.expected, current) {
            (Some(expected), Some(current)) if T::Guard::precedes(&current.token(), expected) => {
                let found = T::Guard::describe(&current.token());
                Explanation::AskIfBehind(Behind(Box::new(Conflict::new(
                    table,
                    format!("{:?}", self.key),
                    T::Guard::describe(expected),
                    found,
                    current,
                ))))
            }
            (_, current) => Explanation::of(self.given_in(table, current)),
        }
    }

    /// [`given`](Self::given) for the entity of `table`.
    pub(crate) fn given_in(self, table: &'static str, current: Option<T>) -> Error {
        let key = self.key;
        let Some(current) = current else {
            return Error::NotFound {
                table,
                key: format!("{key:?}"),
            };
        };
        let token = current.token();
        match self.expected {
            Some(expected) if token != *expected => {
                let conflict = Conflict::new(
                    table,
                    format!("{key:?}"),
                    T::Guard::describe(expected),
                    T::Guard::describe(&token),
                    current,
                );
                crate::telemetry::conflict(&conflict);
                Error::Conflict(Box::new(conflict))
            }
            None if (self.at_end)(&token) => Error::VersionOverflow {
                table,
                key: format!("{key:?}"),
                current: T::Guard::describe(&token),
            },
            _ if self.state.is_some() && current.status_name() != self.state => {
                Error::StatusNotWritable {
                    table,
                    column: T::STATUS_COLUMN.unwrap_or_default().to_string(),
                    detail: format!(
                        "the saved copy is in state `{}`, the row in `{}`",
                        self.state.unwrap_or_default(),
                        current.status_name().unwrap_or_default()
                    ),
                }
            }
            _ => Error::Refused {
                table,
                key: format!("{key:?}"),
                token: T::Guard::describe(&token),
            },
        }
    }
}

/// The explanation of a write's miss from the row re-read after it, as the blocking and
/// the async paths both complete it.
pub(crate) enum Explanation {
    /// The re-read says it all.
    Done(Error),
    /// The row holds the expected token, so nothing the caller could see refused the
    /// write: ask the server whether it applies other servers' commits late
    /// ([`OccBackend::applies_writes_late`]), then [`Refusal::on_server`].
    AskIfLate(Refusal),
    /// The row holds a token older than the copy's: ask the server whether it applies
    /// other servers' commits late, then [`Behind::on_server`].
    AskIfBehind(Behind),
}

impl Explanation {
    /// What `explained` (a re-read's verdict) still needs.
    pub(crate) fn of(explained: Error) -> Self {
        match explained {
            Error::Refused { table, key, token } => {
                Explanation::AskIfLate(Refusal { table, key, token })
            }
            done => Explanation::Done(done),
        }
    }
}

/// A write that matched nothing while the row holds the expected token.
pub(crate) struct Refusal {
    table: &'static str,
    key: String,
    token: crate::error::Token,
}

impl Refusal {
    /// The refusal on a server that applies other servers' commits late or not
    /// (`applies_late`): there (a Galera node) the node ran the `UPDATE` against its copy
    /// before it had applied the commit that the caller's copy was read after (the
    /// re-read, later, sees it), and the next attempt finds the row applied: retryable.
    /// Elsewhere a trigger, rule or row-level policy refused it: [`Error::Refused`].
    pub(crate) fn on_server(self, applies_late: bool) -> Error {
        let Refusal { table, key, token } = self;
        if applies_late {
            behind_the_cluster(table, &key, &token)
        } else {
            Error::Refused { table, key, token }
        }
    }
}

/// A write that missed a row whose token is older than the copy's.
pub(crate) struct Behind(Box<Conflict>);

impl Behind {
    /// On a server that applies other servers' commits late (a Galera node read without
    /// causal reads) the server had not yet applied the write the copy came from:
    /// retryable, nothing written. Elsewhere the server is the authority and the copy is
    /// ahead of it for good (a write of the copy's that was rolled back, a row deleted and
    /// created again with a lower token, a restored table): a [`Conflict`] with the row as
    /// it is, which the caller can merge or show.
    pub(crate) fn on_server(self, applies_late: bool) -> Error {
        let Behind(conflict) = self;
        if applies_late {
            read_behind(
                conflict.table,
                &conflict.key,
                &conflict.expected,
                &conflict.found,
            )
        } else {
            crate::telemetry::conflict(&conflict);
            Error::Conflict(conflict)
        }
    }
}

/// A write that matched nothing on a node behind the cluster, see [`Refusal::on_server`].
fn behind_the_cluster(table: &str, key: &str, token: &crate::error::Token) -> Error {
    Error::Retryable {
        reason: crate::RetryReason::SerializationFailure,
        source: DieselError::DatabaseError(
            diesel::result::DatabaseErrorKind::SerializationFailure,
            Box::new(format!(
                "the write to `{table}` row {key} matched nothing on a cluster node that had \
                 not yet applied the commit at {token} when it ran"
            )),
        ),
    }
}

/// A write that matched nothing on a node whose row is older than the caller's copy, see
/// [`Behind::on_server`]. Not a conflict: nobody wrote after the copy, the node has not
/// yet applied the copy's write.
fn read_behind(
    table: &str,
    key: &str,
    expected: &crate::error::Token,
    found: &crate::error::Token,
) -> Error {
    Error::Retryable {
        reason: crate::RetryReason::ReadBehind,
        source: DieselError::DatabaseError(
            diesel::result::DatabaseErrorKind::Unknown,
            Box::new(format!(
                "the write to `{table}` row {key} expected {expected}, and the server's row \
                 holds the older {found}: the node has not yet applied the write the copy came \
                 from (read with causal reads, wsrep_sync_wait = 1); nothing was written"
            )),
        ),
    }
}

/// [`unreadable`], for a row of `table`, blaming `columns`.
pub(crate) fn unreadable_row(
    table: &'static str,
    key: &impl std::fmt::Debug,
    error: DieselError,
    columns: String,
) -> Result<Error, DieselError> {
    match error {
        DieselError::DeserializationError(cause) if !crate::error::is_cut_short(&*cause) => {
            Ok(Error::InvalidData {
                table,
                column: columns,
                reason: format!(
                    "row {key:?} cannot be read back after the guarded write matched nothing \
                 (a NULL or malformed value would do this): {}",
                    crate::error::with_sources(&*cause)
                ),
            })
        }
        other => Err(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Token;

    fn refused() -> Error {
        Error::Refused {
            table: "orders",
            key: "1".into(),
            token: Token::Version(4),
        }
    }

    #[derive(Debug, Clone, PartialEq, diesel::Queryable, diesel::Identifiable, crate::Guarded)]
    #[diesel(table_name = rows)]
    struct Row {
        id: i64,
        #[occ(version)]
        version: i64,
    }

    diesel::table! {
        rows (id) {
            id -> BigInt,
            version -> BigInt,
        }
    }

    #[test]
    fn a_row_older_than_the_copy_is_a_node_behind_only_where_commits_apply_late() {
        let ask = |current: Row| match RowMoved::<Row>::expecting(&1, &7)
            .explained("rows", Some(current))
        {
            Explanation::AskIfBehind(behind) => Some(behind),
            _ => None,
        };
        let behind = ask(Row { id: 1, version: 6 })
            .expect("asks the server")
            .on_server(true);
        match &behind {
            Error::Retryable {
                reason: crate::RetryReason::ReadBehind,
                source,
            } => {
                let text = source.to_string();
                assert!(
                    text.contains("expected version 7") && text.contains("older version 6"),
                    "{text}"
                );
            }
            other => panic!("expected ReadBehind, got {other:?}"),
        }
        assert!(behind.is_retryable());
        // On the authority (no commits applied late) the copy is ahead for good: a
        // conflict with the row as it is, e.g. after the copy's own write rolled back.
        let ahead = ask(Row { id: 1, version: 6 })
            .expect("asks the server")
            .on_server(false);
        match &ahead {
            Error::Conflict(conflict) => {
                assert_eq!(conflict.current::<Row>(), Some(&Row { id: 1, version: 6 }))
            }
            other => panic!("expected a Conflict, got {other:?}"),
        }
        assert!(
            ask(Row { id: 1, version: 8 }).is_none(),
            "a newer row asks nothing"
        );
        let newer =
            RowMoved::<Row>::expecting(&1, &7).explained("rows", Some(Row { id: 1, version: 8 }));
        assert!(matches!(newer, Explanation::Done(Error::Conflict(_))));
    }

    #[test]
    fn a_refusal_on_a_node_that_applies_commits_late_is_retryable() {
        let Explanation::AskIfLate(refusal) = Explanation::of(refused()) else {
            panic!("a refusal asks the server")
        };
        let error = refusal.on_server(true);
        assert!(error.is_retryable(), "{error:?}");
        assert!(error.to_string().contains("had not yet applied"), "{error}");
    }

    #[test]
    fn a_refusal_elsewhere_stays_refused_and_other_verdicts_ask_nothing() {
        let Explanation::AskIfLate(refusal) = Explanation::of(refused()) else {
            panic!("a refusal asks the server")
        };
        assert!(matches!(refusal.on_server(false), Error::Refused { .. }));
        let not_found = Error::NotFound {
            table: "orders",
            key: "1".into(),
        };
        assert!(matches!(
            Explanation::of(not_found),
            Explanation::Done(Error::NotFound { .. })
        ));
    }
}

/// When a write by key alone runs again. It takes the row with any token, so a miss
/// whose re-read finds the row ([`Error::Refused`]) was refused by the database or raced
/// an insert (the `UPDATE` ran before the insert committed): nothing else tells these
/// apart, and nothing was written. It runs again while each re-read finds another row
/// than the one before (inserted, deleted and inserted again meanwhile), up to
/// [`KeyWriteRuns::MOST`] runs; the same row refusing twice is a refusal.
#[derive(Debug, Default)]
pub(crate) struct KeyWriteRuns {
    runs: u32,
    refused_at: Option<crate::error::Token>,
}

impl KeyWriteRuns {
    /// The most runs of one write.
    pub(crate) const MOST: u32 = 4;

    /// Whether the write that answered `answer` runs again.
    pub(crate) fn again<W>(&mut self, answer: &Result<W, Error>) -> bool {
        self.runs += 1;
        let Err(Error::Refused { token, .. }) = answer else {
            return false;
        };
        let another_row = self.refused_at.as_ref() != Some(token);
        self.refused_at = Some(token.clone());
        another_row && self.runs < Self::MOST
    }
}
