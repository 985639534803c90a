//! A compare-and-set write as a value, and the judgement of its answer: the checks made
//! before it is sent, how many rows it must match, and what a database error means.
//! Both drivers send the statement ([`CompareAndSet::checked`] hands it over) and give
//! the answer to [`Judge::sent`]; neither decides anything about it.

use std::fmt::Debug;

use diesel::result::Error as DieselError;

use crate::error::Error;
use crate::sql::statement::Assignments;

/// How many rows a statement must match to have done its job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Matches {
    /// The one row its key addresses: 0 is a miss, more is [`Error::KeyNotUnique`].
    One,
    /// Every one of `n` rows (locked beforehand): fewer is a miss, more is
    /// [`Error::KeyNotUnique`]. Task claims are its one user.
    #[cfg_attr(not(feature = "locks"), allow(dead_code))]
    All(usize),
    /// Any number: a write by filter, or an insert that may find its row there.
    Any,
}

/// One compare-and-set write: the statement, what it writes (for messages), how many rows
/// it must match, and the explanation of a miss.
pub(crate) struct CompareAndSet<'k, S, M> {
    statement: S,
    table: &'static str,
    key: &'k (dyn Debug + Sync),
    matches: Matches,
    miss: M,
}

/// What a statement that did its job reports: the rows it matched and, for a guard whose
/// next token only the database knows, that token.
#[derive(Debug)]
pub(crate) struct Written<Tok> {
    pub(crate) rows: usize,
    pub(crate) token: Option<Tok>,
}

impl<'k, S, M> CompareAndSet<'k, S, M> {
    /// The table written, and the row's key: what the write's telemetry names.
    #[cfg_attr(not(feature = "locks"), allow(dead_code))] // Locks and claims only.
    pub(crate) fn target(&self) -> (&'static str, &'k (dyn Debug + Sync)) {
        (self.table, self.key)
    }

    /// `statement` on the row of `table` with `key`, which must match it; `miss` explains
    /// a miss.
    pub(crate) fn one(
        statement: S,
        table: &'static str,
        key: &'k (dyn Debug + Sync),
        miss: M,
    ) -> Self {
        CompareAndSet {
            statement,
            table,
            key,
            matches: Matches::One,
            miss,
        }
    }

    /// The same write, needing `matches` rows.
    pub(crate) fn matching(self, matches: Matches) -> Self {
        CompareAndSet { matches, ..self }
    }

    /// The checks made before anything is sent ([`refuse_double_assignment`]): the
    /// statement to send, and what judges its answer. Both drivers send the
    /// statement and hand its answer to the judge.
    pub(crate) fn checked<DB>(self) -> Result<(S, Judge<'k, M>), Error>
    where
        S: Assignments<DB>,
    {
        refuse_double_assignment(self.table, &self.statement)?;
        let judge = Judge {
            table: self.table,
            key: self.key,
            matches: self.matches,
            miss: self.miss,
        };
        Ok((self.statement, judge))
    }
}

/// What a sent compare-and-set statement is judged by: how many rows it had to match.
pub(crate) struct Judge<'k, M> {
    table: &'static str,
    key: &'k (dyn Debug + Sync),
    matches: Matches,
    miss: M,
}

/// The verdict on a statement's answer.
pub(crate) enum Judged<Tok, M> {
    /// It matched the rows it had to.
    Written(Written<Tok>),
    /// It matched fewer: the miss explains why, from the database.
    Missed(M),
}

impl<M> Judge<'_, M> {
    /// Judges the rows the statement matched (and the token it read back):
    /// as many as it must match is written, fewer a miss to explain, more
    /// [`Error::KeyNotUnique`].
    pub(crate) fn sent<Tok>(
        self,
        (rows, token): (usize, Option<Tok>),
    ) -> Result<Judged<Tok, M>, Error> {
        let wanted = match self.matches {
            Matches::One => 1,
            Matches::All(n) => n,
            Matches::Any => rows,
        };
        if rows < wanted {
            return Ok(Judged::Missed(self.miss));
        }
        if rows > wanted {
            return Err(Error::KeyNotUnique {
                table: self.table,
                key: format!("{:?}", self.key),
                rows,
            });
        }
        Ok(Judged::Written(Written { rows, token }))
    }
}

/// [`Error::ChangesetAssignsGuard`] when `statement` assigns a column twice (the caller's
/// changes and the guard's advance): checked before anything is sent.
pub(crate) fn refuse_double_assignment<DB, S: Assignments<DB>>(
    table: &'static str,
    statement: &S,
) -> Result<(), Error> {
    match statement.assigned_twice()? {
        Some(column) => Err(Error::ChangesetAssignsGuard { table, column }),
        None => Ok(()),
    }
}

/// [`Error::StatusNotWritable`] when `statement` assigns the status column `status` more
/// often than `allowed` (once for a transition, which sets it itself; never for any other
/// write): checked before anything is sent. Entities without a status pay nothing.
pub(crate) fn refuse_status_write<DB, S: Assignments<DB>>(
    table: &'static str,
    status: Option<&'static str>,
    statement: &S,
    allowed: usize,
) -> Result<(), Error> {
    let Some(column) = status else {
        return Ok(());
    };
    if statement.assignments_to(column)? <= allowed {
        return Ok(());
    }
    Err(Error::StatusNotWritable {
        table,
        column: column.to_string(),
        detail: if allowed == 0 {
            "the changeset assigns it".to_string()
        } else {
            "the transition's extra changes assign it too".to_string()
        },
    })
}

/// The classification of one statement's error, made ready beforehand: whether the
/// statement ran inside a transaction and the retry reason the backend read (asked of
/// the server where the client keeps only the text), for a judgement that takes it as a
/// closure.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Classifier {
    pub(crate) in_transaction: bool,
    pub(crate) reason: Option<crate::error::RetryReason>,
}

impl Classifier {
    /// `error`, classified.
    pub(crate) fn classify(self, error: DieselError) -> Error {
        classify_given(error, self.in_transaction, |_| self.reason)
    }
}

/// [`classify`] given whether the statement ran inside a transaction and how the backend
/// reads a retry reason: what the sync and the async executors share.
pub(crate) fn classify_given(
    error: DieselError,
    in_transaction: bool,
    retry_reason: impl FnOnce(&DieselError) -> Option<crate::error::RetryReason>,
) -> Error {
    let error = crate::error::answer_cut_short(error);
    if !in_transaction && crate::error::connection_lost(&error) {
        return Error::Ambiguous { source: error };
    }
    if let Some(table) = crate::error::missing_library_table(&error) {
        return Error::MissingTable {
            table,
            source: error,
        };
    }
    Error::classified(error, retry_reason)
}
