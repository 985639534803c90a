//! Batches of guarded writes with an outcome per row.
//!
//! Each row is `(key, the token the caller read, changes)`. Every row is tried, so the
//! caller learns at once which rows were written, which conflicted (with their current
//! row) and which were missing, instead of stopping at the first miss. In
//! [`BatchMode::AllOrNothing`] the batch runs in a transaction (a savepoint inside the
//! caller's) that is committed only when every row was written; in
//! [`BatchMode::Partial`] each written row stays written.
//!
//! Cost, plus the transaction's `BEGIN` and `COMMIT` in all-or-nothing mode:
//! - PostgreSQL: one statement for up to [`ROWS_PER_STATEMENT`] rows that set the same
//!   columns (an `UPDATE ... FROM (VALUES ...)` with each row's values and expected token
//!   in the list), plus one read of all the rows that missed. Rows that set other columns
//!   (a changeset whose `None` fields leave some out) go in a statement of their own
//!   shape, and a key that comes again starts the next statement (two updates of one row
//!   in one statement would race). A batch of 1,000 rows of one shape is one `UPDATE`:
//!   about 6x faster than one statement per row (BENCHMARKS.md, W5).
//! - MySQL / MariaDB and SQLite: one statement per row, plus one read per row that
//!   missed. Neither can update rows with different values in one statement while
//!   checking each row's own guard; SQLite runs in-process, so its round trips are
//!   function calls.
//!
//! A database error (a deadlock, a lost connection) ends the batch with that error. On
//! PostgreSQL it undoes the whole statement it hit, so in a partial batch the rows of
//! that statement are not written either.

use std::future::Future;

use diesel::connection::LoadConnection;
use diesel::query_builder::{AsChangeset, QueryFragment};

use crate::connect::backend::OccBackend;
use crate::connect::transaction::WriteTransaction;
use crate::drive::blocking::complete::{Complete, CompleteEach};
use crate::drive::blocking::load::LoadByKey;
use crate::drive::{now, Blocking, End, Ended, Io, ReadOn, RunEachOn, RunOn, WriteAttempt};
use crate::error::Error;
use crate::flow::batch::rows::{BuiltRows, Pending, RoundWritten};
use crate::flow::batch::{Batch, Effect};
use crate::flow::compare_and_set::{refuse_double_assignment, CompareAndSet};
use crate::flow::miss::RowMoved;
use crate::guard::{CompletionOf, Guarded, TokenOf};
use crate::operation::{BatchDelete, BatchUpdate, Operation, Run};
use crate::sql::new_token::Counted;
use crate::sql::statement::Assignments;
use crate::telemetry::Call;

use crate::write::entity::{
    delete_statement, guarded_statement_in, DeleteOf, DeleteRow, GuardedWrite, UpdateOf, UpdateRow,
};

pub use crate::operation::batch::{BatchMode, BatchReport, RowOutcome};

/// Guarded batches for every [`GuardedWrite`] entity.
pub trait GuardedBatch: GuardedWrite {
    /// Applies each `(key, expected token, changes)` row as
    /// [`guarded_update_by_key`](GuardedWrite::guarded_update_by_key) would, and reports
    /// every row's outcome. Every row's statement is built and checked before anything is
    /// sent (and held in memory until the batch ends): a refused row (a changeset that
    /// assigns the guard, a version that cannot advance) stops the batch with nothing
    /// written. Misses (conflict, not found,
    /// refused) are outcomes; a database error (a deadlock, a lost connection) ends the
    /// batch with that error, after rolling back an all-or-nothing batch.
    fn guarded_update_batch<C, Ch, I>(
        conn: &mut C,
        rows: I,
        mode: BatchMode,
    ) -> Result<BatchReport<TokenOf<Self>>, Error>
    where
        C: WriteTransaction,
        I: IntoIterator<Item = (Self::Key, TokenOf<Self>, Ch)>,
        Self: UpdateBatch<C, Ch>,
    {
        BatchUpdate::<Self, Ch>::new(rows.into_iter().collect(), mode).run(conn)
    }

    /// Deletes each `(key, expected token)` row as
    /// [`guarded_delete_by_key`](GuardedWrite::guarded_delete_by_key) would, and reports
    /// every row's outcome ([`RowOutcome::Written`] for a deleted row). One statement per
    /// row on every backend. Misses are outcomes; a database error ends the batch, as in
    /// [`guarded_update_batch`](Self::guarded_update_batch).
    fn guarded_delete_batch<C, I>(
        conn: &mut C,
        rows: I,
        mode: BatchMode,
    ) -> Result<BatchReport<()>, Error>
    where
        C: WriteTransaction,
        I: IntoIterator<Item = (Self::Key, TokenOf<Self>)>,
        Self: DeleteRow<C>,
    {
        BatchDelete::<Self>::new(rows.into_iter().collect(), mode).run(conn)
    }
}

impl<T: GuardedWrite> GuardedBatch for T {}

/// A batch of guarded updates of entity `Self` with changes `Ch` on connection `C`, as
/// one bound; like [`UpdateRow`], not a trait to implement.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot run a batch of guarded updates with `{Ch}` on `{C}`",
    note = "the changes must be for the entity's table, the connection a diesel connection of a backend diesel-occ supports, and the guard's SQL must fit that backend",
    note = "on a diesel-async connection, call the async API instead: `use diesel_occ::asynchronous::prelude::*`, not `diesel_occ::prelude::*`"
)]
pub trait UpdateBatch<C, Ch>: UpdateRow<C, Ch> {
    /// Writes the rows in `mode`, one outcome each; [`GuardedBatch`] runs it.
    #[doc(hidden)]
    fn update_batch(
        conn: &mut C,
        rows: Vec<(Self::Key, TokenOf<Self>, Ch)>,
        mode: BatchMode,
    ) -> Result<BatchReport<TokenOf<Self>>, Error>;
}

// Errors name this trait and its hints, not the first bound of the impl that fails.
#[diagnostic::do_not_recommend]
impl<T, C, Ch> UpdateBatch<C, Ch> for T
where
    T: UpdateRow<C, Ch>,
    C: LoadConnection + WriteTransaction + Send,
    C::Backend: OccBackend,
    Ch: AsChangeset<Target = T::Table>,
    UpdateOf<T, Ch::Changeset>: Assignments<C::Backend> + QueryFragment<C::Backend> + Send,
    CompletionOf<T>: Complete<C, UpdateOf<T, Ch::Changeset>, TokenOf<T>>
        + CompleteEach<C, UpdateOf<T, Ch::Changeset>, TokenOf<T>>,
{
    fn update_batch(
        conn: &mut C,
        rows: Vec<(T::Key, TokenOf<T>, Ch)>,
        mode: BatchMode,
    ) -> Result<BatchReport<TokenOf<T>>, Error> {
        let table = T::table_name();
        let rows = updates::<T, C::Backend, Ch>(table, rows)?;
        let conn = Blocking::wrap(conn);
        let flow = Batch::new(table, rows, mode, conn.in_transaction(), written_token::<T>)
            .of_updates(C::Backend::COMBINES_UPDATES);
        now(drive::<T, _, _, _, Updates>(conn, flow))
    }
}

impl<T: UpdateBatch<C, Ch>, C, Ch> Run<C> for BatchUpdate<T, Ch> {
    fn run(self, conn: &mut C) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        T::update_batch(conn, self.rows, self.mode)
    }
}

impl<T: DeleteRow<C>, C: WriteTransaction> Run<C> for BatchDelete<T> {
    fn run(self, conn: &mut C) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        T::delete_batch(conn, self.rows, self.mode)
    }
}

/// The token a written row holds: the one the database read back, if the guard reads
/// one, else the one computed before sending.
pub(crate) fn written_token<T: Guarded>(
    returned: Option<TokenOf<T>>,
    next: TokenOf<T>,
) -> TokenOf<T> {
    returned.unwrap_or(next)
}

/// Every row's guarded update, built and checked before anything is sent: the first
/// refusal ([`Error::ChangesetAssignsGuard`], [`Error::StatusNotWritable`],
/// [`Error::VersionOverflow`]) refuses the batch.
pub(crate) fn updates<T, DB, Ch>(
    table: &'static str,
    rows: Vec<(T::Key, TokenOf<T>, Ch)>,
) -> Result<BuiltRows<T, UpdateOf<T, Ch::Changeset>>, Error>
where
    T: Guarded,
    Ch: AsChangeset<Target = T::Table>,
    UpdateOf<T, Ch::Changeset>: Assignments<DB>,
{
    rows.into_iter()
        .map(|(key, expected, changes)| {
            let (update, next) = guarded_statement_in::<T, DB, Ch>(
                table,
                &key,
                &expected,
                changes,
                T::stamp(),
                None,
            )?;
            refuse_double_assignment(table, &update)?;
            Ok((Pending::new(key, expected, next), update))
        })
        .collect()
}

/// Every row's guarded delete.
pub(crate) fn deletes<T: Guarded>(rows: Vec<(T::Key, TokenOf<T>)>) -> BuiltRows<T, DeleteOf<T>> {
    rows.into_iter()
        .map(|(key, expected)| {
            let statement = delete_statement::<T>(&key, &expected);
            let next = expected.clone();
            (Pending::new(key, expected, next), statement)
        })
        .collect()
}

/// A batch of guarded deletes: [`DeleteRow::delete_batch`].
pub(crate) fn delete_batch<T, C>(
    conn: &mut C,
    rows: Vec<(T::Key, TokenOf<T>)>,
    mode: BatchMode,
) -> Result<BatchReport<()>, Error>
where
    T: LoadByKey<C>,
    C: LoadConnection + WriteTransaction + Send,
    C::Backend: OccBackend,
    DeleteOf<T>: Assignments<C::Backend> + Send,
    Counted: Complete<C, DeleteOf<T>, TokenOf<T>>,
{
    let rows = deletes::<T>(rows);
    let conn = Blocking::wrap(conn);
    let flow = Batch::new(
        T::table_name(),
        rows,
        mode,
        conn.in_transaction(),
        |_, _| (),
    );
    now(drive::<T, _, _, _, Deletes>(conn, flow))
}

/// How a batch's statements `S` of entity `T` are sent on connection `C`.
pub(crate) trait SendBatch<T: Guarded, C, S> {
    /// Sends a round's statements as the backend's combined statements.
    fn round(
        conn: &mut C,
        updates: Vec<S>,
        own: bool,
    ) -> impl Future<Output = Result<RoundWritten<TokenOf<T>>, Error>> + Send;

    /// Sends one row's statement as a guarded write: the token read back, if the guard
    /// reads one.
    fn row(
        conn: &mut C,
        key: &T::Key,
        expected: &TokenOf<T>,
        statement: S,
        own: bool,
    ) -> impl Future<Output = Result<Option<TokenOf<T>>, Error>> + Send;
}

/// A batch of guarded updates: combined rounds where the backend combines them.
pub(crate) struct Updates;

impl<T, C, S> SendBatch<T, C, S> for Updates
where
    C: Io,
    T: ReadOn<C>,
    S: Assignments<C::Backend> + Send,
    CompletionOf<T>: RunEachOn<C, S, TokenOf<T>> + for<'k> RunOn<C, S, RowMoved<'k, T>, TokenOf<T>>,
{
    async fn round(
        conn: &mut C,
        updates: Vec<S>,
        own: bool,
    ) -> Result<RoundWritten<TokenOf<T>>, Error> {
        if updates.is_empty() {
            return Ok(Vec::new());
        }
        let send = async |conn: &mut C| CompletionOf::<T>::run_each(conn, updates).await;
        conn.protect_caller(own, send).await
    }

    fn row(
        conn: &mut C,
        key: &T::Key,
        expected: &TokenOf<T>,
        update: S,
        own: bool,
    ) -> impl Future<Output = Result<Option<TokenOf<T>>, Error>> + Send {
        guarded_row::<T, C, S, CompletionOf<T>>(conn, key, expected, update, own)
    }
}

/// A batch of guarded deletes: one statement per row on every backend.
pub(crate) struct Deletes;

impl<T, C, S> SendBatch<T, C, S> for Deletes
where
    C: Io,
    T: ReadOn<C>,
    S: Assignments<C::Backend> + Send,
    Counted: for<'k> RunOn<C, S, RowMoved<'k, T>, TokenOf<T>>,
{
    async fn round(_: &mut C, _: Vec<S>, _: bool) -> Result<RoundWritten<TokenOf<T>>, Error> {
        unreachable!("a batch of deletes writes its rows one by one")
    }

    fn row(
        conn: &mut C,
        key: &T::Key,
        expected: &TokenOf<T>,
        delete: S,
        own: bool,
    ) -> impl Future<Output = Result<Option<TokenOf<T>>, Error>> + Send {
        guarded_row::<T, C, S, Counted>(conn, key, expected, delete, own)
    }
}

/// One row's guarded write, its statement sent the way `K` says: the token read back, if
/// the guard reads one.
async fn guarded_row<T, C, S, K>(
    conn: &mut C,
    key: &T::Key,
    expected: &TokenOf<T>,
    statement: S,
    own: bool,
) -> Result<Option<TokenOf<T>>, Error>
where
    C: Io,
    T: ReadOn<C>,
    K: for<'k> RunOn<C, S, RowMoved<'k, T>, TokenOf<T>>,
{
    let miss = RowMoved::<T>::expecting(key, expected);
    let write = CompareAndSet::one(statement, T::table_name(), key, miss);
    Ok(K::run(conn, write, own).await?.token)
}

/// The driver of the batch [flow](crate::flow::batch), on both APIs: `K` sends the
/// statements, each told whether the open transaction is the library's; an
/// all-or-nothing batch runs in a write transaction of the library's.
pub(crate) async fn drive<T, C, S, Out, K>(
    conn: &mut C,
    mut flow: Batch<T, S, Out>,
) -> Result<BatchReport<Out>, Error>
where
    C: Io + WriteAttempt,
    T: ReadOn<C>,
    K: SendBatch<T, C, S>,
{
    let call = Call::new::<<C as Io>::Backend>("batch", T::table_name(), None);
    let answer = call
        .run(async {
            let mut effect = flow.start();
            loop {
                effect = match effect {
                    Effect::Begin => {
                        let transaction = async |conn: &mut C| {
                            let mut effect = flow.began(Ok(()));
                            loop {
                                effect = match effect {
                                    Effect::Commit => return (End::Commit, ()),
                                    Effect::Rollback => return (End::Rollback, ()),
                                    other => step::<T, C, S, Out, K>(conn, &mut flow, other).await,
                                }
                            }
                        };
                        match conn.write_transaction(transaction).await {
                            Ended::NotBegun(error) => flow.began(Err(error)),
                            Ended::Committed((), committed) => flow.committed(committed),
                            Ended::RolledBack((), rolled_back) => flow.rolled_back(rolled_back),
                        }
                    }
                    Effect::Done => return flow.outcome(),
                    other => step::<T, C, S, Out, K>(conn, &mut flow, other).await,
                };
            }
        })
        .await;
    answer
}

/// Performs one effect of a batch outside its transaction's beginning and end.
async fn step<T, C, S, Out, K>(
    conn: &mut C,
    flow: &mut Batch<T, S, Out>,
    effect: Effect<S, T::Key>,
) -> Effect<S, T::Key>
where
    C: Io + WriteAttempt,
    T: ReadOn<C>,
    K: SendBatch<T, C, S>,
{
    let own = flow.own_transaction();
    match effect {
        Effect::CheckPrecision => flow.checked(T::check_stored_precision(conn).await),
        Effect::SendRound(updates) => flow.sent_round(K::round(conn, updates, own).await),
        Effect::ReadMissed(keys) => {
            let read = T::load_by_keys(conn, &keys).await;
            let classifier = conn.classifier(read.as_ref().err()).await;
            flow.read_missed(read, |e| classifier.classify(e))
        }
        Effect::WriteRow(statement) => {
            let (key, expected) = flow.row();
            let wrote = K::row(conn, key, expected, statement, own).await;
            flow.wrote_row(wrote)
        }
        _ => unreachable!("the batch driver begins and ends the transaction itself"),
    }
}
