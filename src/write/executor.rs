//! The one executor of compare-and-set statements.
//!
//! Every write the library makes is a [`CompareAndSet`]: a statement, the number of rows
//! it must match, and a named [`Miss`] that explains, from the database, why it matched
//! fewer. Entity updates and deletes, batches, bulk updates, transitions, merges, claims,
//! fenced writes, locks and version rows all build one and hand it here, so the checks
//! before sending, the row counting and the classification of database errors are
//! written once.

use std::fmt::Debug;

use diesel::connection::LoadConnection;
use diesel::result::Error as DieselError;

use crate::connect::backend::OccBackend;
use crate::connect::caller_transaction::protect_caller;
use crate::error::Error;
use crate::sql::statement::Assignments;
use crate::write::complete::{Complete, CompleteEach};

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

/// Why a statement matched fewer rows than it must, read from the database after the
/// miss (a re-read of the row, who holds a lock, ...).
pub(crate) trait Miss<C> {
    /// The error that explains the miss. Runs on the connection the statement ran on,
    /// inside the caller's transaction if there is one.
    fn explain(self, conn: &mut C) -> Error;
}

/// A write that cannot miss: [`Matches::Any`] never asks for an explanation.
pub(crate) struct CannotMiss;

impl<C> Miss<C> for CannotMiss {
    fn explain(self, _: &mut C) -> Error {
        Error::Database(DieselError::QueryBuilderError(
            "a write by filter has no rows it must match".into(),
        ))
    }
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

    /// Runs the write on `conn` the way `K` says, and classifies its outcome:
    ///
    /// - a changeset that assigns a column the guard sets: [`Error::ChangesetAssignsGuard`],
    ///   before anything is sent;
    /// - as many rows as it must match: `Ok`;
    /// - fewer: the [`Miss`] explains why;
    /// - more: [`Error::KeyNotUnique`], the key does not address one row;
    /// - a database error: see [`classify`].
    ///
    /// `own` says whether `conn`'s open transaction, if any, is one the library opened
    /// for its own statements (see [`protect_caller`]).
    pub(crate) fn run<C, K, Tok>(self, conn: &mut C, own: bool) -> Result<Written<Tok>, Error>
    where
        C: LoadConnection,
        C::Backend: OccBackend,
        S: Assignments<C::Backend>,
        K: Complete<C, S, Tok>,
        M: Miss<C>,
    {
        let (statement, judge) = self.checked::<C::Backend>()?;
        let sent = protect_caller(conn, own, |conn| K::run(conn, statement, own));
        match judge.sent(sent.map_err(|e| classify(conn, e))?)? {
            Judged::Written(written) => Ok(written),
            Judged::Missed(miss) => Err(miss.explain(conn)),
        }
    }

    /// The checks made before anything is sent ([`refuse_double_assignment`]): the
    /// statement to send, and what judges its answer. What the sync and the async
    /// executors share.
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

/// Runs `statements` in as few statements as the backend allows ([`CompleteEach`]):
/// the index of each one that wrote its row, with its token where the database computed
/// it. The statements must not share a key, and have passed [`refuse_double_assignment`];
/// the caller judges the answer and explains the misses
/// ([`Chunk`](crate::write::batch::Chunk)).
pub(crate) fn run_each<C, S, K, Tok>(
    conn: &mut C,
    own: bool,
    statements: Vec<S>,
) -> Result<Vec<(usize, Option<Tok>)>, Error>
where
    C: LoadConnection,
    C::Backend: OccBackend,
    K: CompleteEach<C, S, Tok>,
{
    if statements.is_empty() {
        return Ok(Vec::new());
    }
    protect_caller(conn, own, |conn| K::run_each(conn, statements)).map_err(|e| classify(conn, e))
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

/// Classifies an error a statement just returned on `conn`: [`Error::Ambiguous`] when the
/// connection died outside a transaction (the write may or may not have been applied),
/// [`Error::Retryable`] when the backend says a fresh attempt can succeed
/// ([`OccBackend::retry_reason`]), else [`Error::Database`].
pub(crate) fn classify<C>(conn: &mut C, error: DieselError) -> Error
where
    C: LoadConnection,
    C::Backend: OccBackend,
{
    let inside = crate::connect::transaction::in_transaction(conn);
    classify_given(error, inside, |e| C::Backend::retry_reason(conn, e))
}

/// [`classify`] given whether the statement ran inside a transaction and how the backend
/// reads a retry reason: what the sync and the async executors share.
pub(crate) fn classify_given(
    error: DieselError,
    in_transaction: bool,
    retry_reason: impl FnOnce(&DieselError) -> Option<crate::error::RetryReason>,
) -> Error {
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
