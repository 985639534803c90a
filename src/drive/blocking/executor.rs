//! The blocking driver of compare-and-set statements.
//!
//! Every write the library makes is a [`CompareAndSet`]: a statement, the number of rows
//! it must match, and a named [`Miss`] that explains, from the database, why it matched
//! fewer. Entity updates and deletes, batches, bulk updates, transitions, merges, claims,
//! fenced writes, locks and version rows all build one; the checks before sending, the row
//! counting and the classification of database errors are its own
//! ([`crate::flow::compare_and_set`]), and this sends it on a blocking connection.

use diesel::connection::LoadConnection;
use diesel::result::Error as DieselError;

use crate::connect::backend::OccBackend;
use crate::connect::caller_transaction::protect_caller;
use crate::drive::blocking::complete::Complete;
use crate::error::Error;
use crate::flow::compare_and_set::{classify_given, CompareAndSet, Judged, Written};
use crate::sql::statement::Assignments;

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

impl<S, M> CompareAndSet<'_, S, M> {
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
    let error = crate::connect::reply_bound::name_the_cut(conn.instrumentation(), error);
    classify_given(error, inside, |e| C::Backend::retry_reason(conn, e))
}
