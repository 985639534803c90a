//! An entity's guarded writes: updates, deletes, excluded fields, writes by key alone.

use std::future::{ready, Future};

use diesel::associations::HasTable;
use diesel::connection::LoadConnection;
use diesel::query_builder::{AsChangeset, QueryFragment};
use diesel::query_dsl::methods::ExecuteDsl;
use diesel::result::Error as DieselError;

use crate::connect::backend::OccBackend;
use crate::drive::blocking::complete::Complete;
use crate::drive::blocking::executor::{classify, Miss};
use crate::drive::blocking::load::{run_precision_check, LoadByKey};
use crate::drive::{now, Blocking, Io, ReadOn, RunOn, UpdateOn};
use crate::error::Error;
use crate::flow::compare_and_set::{refuse_status_write, CompareAndSet};
use crate::flow::miss::{unreadable_row, Explanation, KeyWriteRuns, RowMoved};
use crate::guard::stored_precision::PrecisionCheck;
use crate::guard::{
    AdvanceAnyOf, AdvanceInSql, AdvanceOf, Advancing, CanAdvanceOf, CompletionOf, GuardKind,
    Guarded, TokenOf,
};
use crate::operation::{Delete, Operation, Run, SavedState, TouchStamp, Update, WriteExcluded};
use crate::sql::new_token::Counted;
use crate::sql::statement::{
    assigned_columns, And, Assignments, Comma, GuardedDelete, GuardedUpdate, Joined, NoChanges,
    Unguarded,
};
use crate::telemetry::Call;

/// The guarded `UPDATE` of entity `T` with changeset `Ch`; a save also requires the row
/// to be in the saved copy's state ([`Guarded::StatusKept`]).
pub(crate) type UpdateOf<T, Ch> = GuardedUpdate<
    <T as diesel::associations::HasTable>::Table,
    Ch,
    AdvanceOf<T>,
    <T as Guarded>::KeyPredicate,
    Joined<
        <<T as Guarded>::Guard as GuardKind>::Predicate,
        Option<<T as Guarded>::StatusKept>,
        And,
    >,
>;

/// The unguarded `UPDATE` of entity `T`'s excluded fields with changeset `Ch`.
pub(crate) type UnguardedUpdateOf<T, Ch> = GuardedUpdate<
    <T as diesel::associations::HasTable>::Table,
    Ch,
    Unguarded,
    <T as Guarded>::KeyPredicate,
    Unguarded,
>;

/// The guarded `DELETE` of entity `T`.
pub(crate) type DeleteOf<T> = GuardedDelete<
    <T as diesel::associations::HasTable>::Table,
    <T as Guarded>::KeyPredicate,
    <<T as Guarded>::Guard as GuardKind>::Predicate,
>;

/// The guarded delete of the row with `key` if it still holds `expected`: what every
/// delete sends, blocking or async, alone or in a batch.
pub(crate) fn delete_statement<T: Guarded>(key: &T::Key, expected: &TokenOf<T>) -> DeleteOf<T> {
    DeleteOf::<T>::new(
        T::table(),
        T::key_predicate(key),
        T::Guard::predicate(expected),
    )
}

/// Guarded writes for every [`Guarded`] entity.
///
/// Each write is one statement, `... WHERE <key> AND <the row still holds the token this
/// copy was read with>`, that also moves the row to the next token (for a version guard:
/// `version = ?read` and `version = ?next`). It returns the new token without reading the
/// row back. When it matches no row the row is read once by key to report
/// [`Error::NotFound`], [`Error::Conflict`] with the current row, or [`Error::Refused`].
/// Nothing opens a transaction: inside the caller's transaction the write is part of it.
///
/// Every write has a stateless form (`..._by_key`) for callers that hold a key and the
/// token a client sent back (a web form, an `If-Match` header) rather than a loaded copy;
/// the outcomes are the same.
///
/// When the token cannot advance (a version at its type's maximum) every write fails with
/// [`Error::VersionOverflow`] before anything is sent: versions never wrap, since a
/// wrapped version could repeat a token a stale copy still holds.
pub trait GuardedWrite: Guarded {
    /// Applies `changes` to this row if it still holds this copy's token, and advances the
    /// token. An empty changeset (all fields `None`) just advances the token.
    ///
    /// The copy itself is not modified: its other fields do not reflect `changes`.
    fn guarded_update<C, Ch>(&self, conn: &mut C, changes: Ch) -> Result<TokenOf<Self>, Error>
    where
        Self: UpdateRow<C, Ch>,
    {
        Self::guarded_update_by_key(conn, &self.key(), &self.token(), changes)
    }

    /// Applies `changes` to the row with `key` if it still holds `expected`, and advances
    /// the token; the stateless form of [`guarded_update`](Self::guarded_update).
    fn guarded_update_by_key<C, Ch>(
        conn: &mut C,
        key: &Self::Key,
        expected: &TokenOf<Self>,
        changes: Ch,
    ) -> Result<TokenOf<Self>, Error>
    where
        Self: UpdateRow<C, Ch>,
    {
        Update::<Self, Ch>::new(key.clone(), expected.clone(), changes).run(conn)
    }

    /// Writes every updatable field of this copy if the row still holds its token, and
    /// records the new token in the copy.
    fn guarded_save<C>(&mut self, conn: &mut C) -> Result<TokenOf<Self>, Error>
    where
        Self::Guard: Advancing,
        Self: UpdateRow<C, <Self as Guarded>::Changes>,
    {
        let update = Update::new(self.key(), self.token(), self.changes()).saving(self);
        now(write_and_record(self, Blocking::wrap(conn), update))
    }

    /// Writes every updatable field of this modified copy if the row still holds the
    /// token `original` was read with, and records the new token in this copy. The way to
    /// save with a pre-image guard, whose token is the values read (the modified copy no
    /// longer has them); with any guard, the way to save a copy edited apart from the one
    /// read (a form bound to a new struct).
    fn guarded_save_from<C>(
        &mut self,
        conn: &mut C,
        original: &Self,
    ) -> Result<TokenOf<Self>, Error>
    where
        Self: UpdateRow<C, <Self as Guarded>::Changes>,
    {
        let update = Update::new(original.key(), original.token(), self.changes());
        let update = update.saving_from(self, original);
        now(write_and_record(self, Blocking::wrap(conn), update))
    }

    /// Advances the token without changing anything else ("force increment"), e.g. to
    /// mark an aggregate root changed when only its children were. Records the new token
    /// in the copy.
    fn guarded_touch<C>(&mut self, conn: &mut C) -> Result<TokenOf<Self>, Error>
    where
        Self::Guard: Advancing,
        Self: UpdateRow<C, NoChanges<<Self as HasTable>::Table>>,
    {
        let update = Update::new(self.key(), self.token(), NoChanges::default()).saving(self);
        now(write_and_record(self, Blocking::wrap(conn), update))
    }

    /// Inserts this copy as a new row, with a first token no copy of an earlier row with
    /// the same key can hold (a version starts at the clock in microseconds: see
    /// [`SeedsTokens`](crate::SeedsTokens)), and records that token and the stamp in
    /// the copy. A taken key is [`Error::AlreadyExists`] with the row there; nothing is
    /// written.
    fn guarded_insert<C>(&mut self, conn: &mut C) -> Result<TokenOf<Self>, Error>
    where
        Self: crate::write::insert::InsertRow<C>,
    {
        self.insert_row(conn)
    }

    /// Saves this copy over its row if the row still holds the copy's token
    /// ([`Upserted::Updated`](crate::Upserted::Updated)), or inserts it as
    /// [`guarded_insert`](Self::guarded_insert) does when no row has its key
    /// ([`Upserted::Inserted`](crate::Upserted::Inserted)); records the new token in the
    /// copy. A row there under another token, including one inserted by someone else
    /// between the two statements, is [`Error::Conflict`] with that row; nothing is
    /// written over it.
    fn guarded_upsert<C>(&mut self, conn: &mut C) -> Result<crate::Upserted<TokenOf<Self>>, Error>
    where
        Self: crate::write::upsert::UpsertRow<C>,
    {
        self.upsert_row(conn)
    }

    /// Deletes the row if it still holds this copy's token.
    fn guarded_delete<C>(&self, conn: &mut C) -> Result<(), Error>
    where
        Self: DeleteRow<C>,
    {
        Self::guarded_delete_by_key(conn, &self.key(), &self.token())
    }

    /// Deletes the row with `key` if it still holds `expected`; the stateless form of
    /// [`guarded_delete`](Self::guarded_delete).
    fn guarded_delete_by_key<C>(
        conn: &mut C,
        key: &Self::Key,
        expected: &TokenOf<Self>,
    ) -> Result<(), Error>
    where
        Self: DeleteRow<C>,
    {
        Delete::<Self>::new(key.clone(), expected.clone()).run(conn)
    }

    /// Sets the `#[occ(updated_at)]` column to now without checking or advancing the
    /// token: a maintenance touch (a re-index, a migration that marks rows) that never
    /// conflicts and never makes another writer's copy stale. Records the stamp in the
    /// copy. A missing row is [`Error::NotFound`].
    fn touch_updated_at<C>(&mut self, conn: &mut C) -> Result<(), Error>
    where
        Self: crate::write::updated_at_touch::TouchUpdatedAt<C>,
    {
        let stamp = Self::stamp();
        TouchStamp::<Self>::new(self.key(), stamp.clone()).run(conn)?;
        self.set_stamp(&stamp);
        Ok(())
    }

    /// The stateless form of [`touch_updated_at`](Self::touch_updated_at): the row with
    /// `key`, whatever token it holds.
    fn touch_updated_at_by_key<C>(conn: &mut C, key: &Self::Key) -> Result<(), Error>
    where
        Self: crate::write::updated_at_touch::TouchUpdatedAt<C>,
    {
        TouchStamp::<Self>::new(key.clone(), Self::stamp()).run(conn)
    }

    /// Writes `changes` to this row's excluded fields (`#[occ(exclude)]`: view counters,
    /// last-seen times) without checking or advancing the token, so it never conflicts
    /// and never makes another writer's copy stale. See
    /// [`update_excluded_by_key`](Self::update_excluded_by_key).
    fn update_excluded<C, Ch>(&self, conn: &mut C, changes: Ch) -> Result<(), Error>
    where
        Self: UpdateExcluded<C, Ch>,
    {
        Self::update_excluded_by_key(conn, &self.key(), changes)
    }

    /// Writes `changes` to the excluded fields of the row with `key`: one unguarded
    /// statement, `UPDATE ... SET <changes> WHERE <key>`. A changeset that assigns any
    /// other column is refused before anything is sent ([`Error::NotExcluded`]); an empty
    /// one sends nothing. A missing row is [`Error::NotFound`].
    fn update_excluded_by_key<C, Ch>(
        conn: &mut C,
        key: &Self::Key,
        changes: Ch,
    ) -> Result<(), Error>
    where
        Self: UpdateExcluded<C, Ch>,
    {
        WriteExcluded::<Self, Ch>::new(key.clone(), changes).run(conn)
    }
}

impl<T: Guarded> GuardedWrite for T {}

/// A guarded update of entity `Self` with changes `Ch` on connection `C`, as one bound.
///
/// Not a trait to implement: it holds for every [`Guarded`] entity, every changeset of
/// its table and every connection whose backend the entity's guard can run on.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot run a guarded update with `{Ch}` on `{C}`",
    note = "the changes must be for the entity's table, the connection a diesel connection of a backend diesel-occ supports, and the guard's SQL must fit that backend (an `xmin` guard needs PostgreSQL)",
    note = "on a diesel-async connection, call the async API instead: `use diesel_occ::asynchronous::prelude::*`, not `diesel_occ::prelude::*`"
)]
pub trait UpdateRow<C, Ch>: LoadByKey<C> {
    /// Runs the update; the methods of [`GuardedWrite`] call it. `saved` is the state of
    /// the copy a save writes: the row must be in it.
    #[doc(hidden)]
    fn update_row(
        conn: &mut C,
        key: &Self::Key,
        expected: &TokenOf<Self>,
        changes: Ch,
        stamp: Self::Stamp,
        saved: Option<SavedState<Self>>,
        own: bool,
    ) -> Result<TokenOf<Self>, Error>;
}

// Errors name this trait and its hints, not the first bound of the impl that fails.
#[diagnostic::do_not_recommend]
impl<T, C, Ch> UpdateRow<C, Ch> for T
where
    T: LoadByKey<C>,
    C: LoadConnection + Send,
    C::Backend: OccBackend,
    Ch: AsChangeset<Target = T::Table>,
    UpdateOf<T, Ch::Changeset>: Assignments<C::Backend> + Send,
    CompletionOf<T>: Complete<C, UpdateOf<T, Ch::Changeset>, TokenOf<T>>,
{
    fn update_row(
        conn: &mut C,
        key: &T::Key,
        expected: &TokenOf<T>,
        changes: Ch,
        stamp: T::Stamp,
        saved: Option<SavedState<T>>,
        own: bool,
    ) -> Result<TokenOf<T>, Error> {
        let conn = Blocking::wrap(conn);
        now(update_row::<T, _, Ch>(
            conn, key, expected, changes, stamp, saved, own,
        ))
    }
}

impl<T: UpdateRow<C, Ch>, C, Ch> Run<C> for Update<T, Ch> {
    fn run(self, conn: &mut C) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        let (key, expected) = (&self.key, &self.expected);
        T::update_row(
            conn,
            key,
            expected,
            self.changes,
            self.stamp,
            self.saved,
            self.own,
        )
    }
}

/// A guarded delete of entity `Self` on connection `C`, as one bound; like
/// [`UpdateRow`], not a trait to implement.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot run a guarded delete on `{C}`",
    note = "the connection must be a diesel connection of a backend diesel-occ supports, and the guard's SQL must fit that backend",
    note = "on a diesel-async connection, call the async API instead: `use diesel_occ::asynchronous::prelude::*`, not `diesel_occ::prelude::*`"
)]
pub trait DeleteRow<C>: LoadByKey<C> {
    /// Runs the delete; the methods of [`GuardedWrite`] call it.
    #[doc(hidden)]
    fn delete_row(conn: &mut C, key: &Self::Key, expected: &TokenOf<Self>) -> Result<(), Error>;

    /// Deletes the rows in `mode`, one outcome each; [`GuardedBatch`](crate::GuardedBatch)
    /// runs it.
    #[doc(hidden)]
    fn delete_batch(
        conn: &mut C,
        rows: Vec<(Self::Key, TokenOf<Self>)>,
        mode: crate::write::batch::BatchMode,
    ) -> Result<crate::write::batch::BatchReport<()>, Error>
    where
        C: crate::connect::transaction::WriteTransaction;
}

// Errors name this trait and its hints, not the first bound of the impl that fails.
#[diagnostic::do_not_recommend]
impl<T, C> DeleteRow<C> for T
where
    T: LoadByKey<C>,
    C: LoadConnection + Send,
    C::Backend: OccBackend,
    DeleteOf<T>: ExecuteDsl<C> + Assignments<C::Backend> + Send,
{
    fn delete_row(conn: &mut C, key: &T::Key, expected: &TokenOf<T>) -> Result<(), Error> {
        now(delete_row::<T, _>(Blocking::wrap(conn), key, expected))
    }

    fn delete_batch(
        conn: &mut C,
        rows: Vec<(T::Key, TokenOf<T>)>,
        mode: crate::write::batch::BatchMode,
    ) -> Result<crate::write::batch::BatchReport<()>, Error>
    where
        C: crate::connect::transaction::WriteTransaction,
    {
        crate::write::batch::delete_batch::<T, C>(conn, rows, mode)
    }
}

impl<T: DeleteRow<C>, C> Run<C> for Delete<T> {
    fn run(self, conn: &mut C) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        T::delete_row(conn, &self.key, &self.expected)
    }
}

/// An unguarded update of entity `Self`'s excluded fields with changes `Ch` on connection
/// `C`, as one bound; like [`UpdateRow`], not a trait to implement.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot update its excluded fields with `{Ch}` on `{C}`",
    note = "the changes must be for the entity's table and the connection a diesel connection of a backend diesel-occ supports",
    note = "on a diesel-async connection, call the async API instead: `use diesel_occ::asynchronous::prelude::*`, not `diesel_occ::prelude::*`"
)]
pub trait UpdateExcluded<C, Ch>: LoadByKey<C> {
    /// Runs the update; the methods of [`GuardedWrite`] call it.
    #[doc(hidden)]
    fn update_excluded_row(conn: &mut C, key: &Self::Key, changes: Ch) -> Result<(), Error>;
}

// Errors name this trait and its hints, not the first bound of the impl that fails.
#[diagnostic::do_not_recommend]
impl<T, C, Ch> UpdateExcluded<C, Ch> for T
where
    T: LoadByKey<C>,
    C: LoadConnection + Send,
    C::Backend: OccBackend,
    Ch: AsChangeset<Target = T::Table>,
    Ch::Changeset: QueryFragment<C::Backend> + Clone + Send,
    T::Stamp: QueryFragment<C::Backend>,
    UnguardedUpdateOf<T, Ch::Changeset>: ExecuteDsl<C> + Assignments<C::Backend> + Send,
{
    fn update_excluded_row(conn: &mut C, key: &T::Key, changes: Ch) -> Result<(), Error> {
        match excluded_changeset::<T, C::Backend, Ch>(T::table_name(), changes)? {
            Some(changes) => write_unguarded_by_key::<T, C, _>(conn, key, changes),
            None => Ok(()),
        }
    }
}

impl<T: UpdateExcluded<C, Ch>, C, Ch> Run<C> for WriteExcluded<T, Ch> {
    fn run(self, conn: &mut C) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        T::update_excluded_row(conn, &self.key, self.changes)
    }
}

/// `changes` to the excluded fields of entity `T` (of `table`) as a changeset, checked
/// before anything is sent: a column that is neither excluded nor the update time is
/// [`Error::NotExcluded`]; `None` when it assigns nothing (nothing to send).
pub(crate) fn excluded_changeset<T, DB, Ch>(
    table: &'static str,
    changes: Ch,
) -> Result<Option<Ch::Changeset>, Error>
where
    T: Guarded,
    DB: OccBackend,
    Ch: AsChangeset<Target = T::Table>,
    Ch::Changeset: QueryFragment<DB>,
    T::Stamp: QueryFragment<DB>,
{
    let changes = changes.as_changeset();
    let columns = assigned_columns::<DB, _>(&changes)?;
    // The update time is not the guard's either: a maintenance job may set it.
    let stamped = assigned_columns::<DB, _>(&T::stamp())?;
    if let Some(column) = columns
        .iter()
        .find(|c| !T::EXCLUDED_COLUMNS.contains(&c.as_str()) && !stamped.contains(c))
    {
        return Err(Error::NotExcluded {
            table,
            column: column.clone(),
        });
    }
    Ok((!columns.is_empty()).then_some(changes))
}

/// `UPDATE <table> SET <changes> WHERE <key>`, outside the guard (neither checked nor
/// advanced): excluded fields and maintenance touches. A missing row is
/// [`Error::NotFound`].
pub(crate) fn write_unguarded_by_key<T, C, X>(
    conn: &mut C,
    key: &T::Key,
    changes: X,
) -> Result<(), Error>
where
    T: LoadByKey<C>,
    C: LoadConnection + Send,
    C::Backend: OccBackend,
    X: Clone + Send,
    UnguardedUpdateOf<T, X>: ExecuteDsl<C> + Assignments<C::Backend> + Send,
{
    now(write_unguarded::<T, _, _>(
        Blocking::wrap(conn),
        key,
        changes,
    ))
}

/// Sends `UPDATE <table> SET <changes> WHERE <key>`, an unguarded write of the row with
/// `key`, on either driver: a missing row is [`Error::NotFound`]. It takes the row with
/// any token, so a miss whose re-read finds the row may have raced the row's insert: it
/// runs again, as [`KeyWriteRuns`] says (hence changes that can be cloned).
pub(crate) async fn write_unguarded<T, C, X>(
    conn: &mut C,
    key: &T::Key,
    changes: X,
) -> Result<(), Error>
where
    C: Io,
    T: ReadOn<C>,
    X: Clone + Send,
    UnguardedUpdateOf<T, X>: Assignments<C::Backend> + Send,
    for<'k> Counted: RunOn<C, UnguardedUpdateOf<T, X>, RowMoved<'k, T>, TokenOf<T>>,
{
    let call = Call::new::<C::Backend>("write_by_key", T::table_name(), Some(key));
    let answer = call
        .run(async move {
            conn.refuse_broken()?;
            let mut runs = KeyWriteRuns::default();
            loop {
                let statement = unguarded_by_key::<T, X>(key, changes.clone());
                let write =
                    CompareAndSet::one(statement, T::table_name(), key, RowMoved::<T>::any(key));
                let answer = conn
                    .call(async |conn: &mut C| {
                        <Counted as RunOn<C, _, _, _>>::run(conn, write, false).await
                    })
                    .await
                    .map(drop);
                if !runs.again(&answer) {
                    return answer;
                }
            }
        })
        .await;
    answer
}

/// `UPDATE <table> SET <changes> WHERE <key>` of entity `T`'s row with `key`.
pub(crate) fn unguarded_by_key<T: Guarded, X>(key: &T::Key, changes: X) -> UnguardedUpdateOf<T, X> {
    UnguardedUpdateOf::<T, X>::new(
        T::table(),
        changes,
        Unguarded,
        T::key_predicate(key),
        Unguarded,
    )
}

/// Runs `update`, a save of `row`, on either driver; on success `row` records the new
/// token and the stamp it wrote. The update is handed to the driver before the future is
/// made, so the future holds the driver's future and the row, not the update's changes.
pub(crate) fn write_and_record<'a, T, C, Ch>(
    row: &'a mut T,
    conn: &'a mut C,
    update: Update<T, Ch>,
) -> impl Future<Output = Result<TokenOf<T>, Error>> + 'a
where
    T: UpdateOn<C, Ch>,
    Ch: 'a,
{
    let stamp = T::stamp();
    let written = T::update_on(conn, update.stamped(stamp.clone()));
    async move {
        let next = written.await?;
        row.set_token(next.clone());
        row.set_stamp(&stamp);
        Ok(next)
    }
}

/// The blocking API's update, as the one read-modify-write driver runs it.
impl<T: UpdateRow<C, Ch>, C, Ch> UpdateOn<Blocking<C>, Ch> for T {
    fn update_on(
        conn: &mut Blocking<C>,
        update: Update<T, Ch>,
    ) -> impl Future<Output = Result<TokenOf<T>, Error>> {
        ready(update.run(conn.inner()))
    }
}

/// The guarded update of the row with `key` from `expected`, with the entity's `stamp`
/// (and, for a save, in the state of the `saved` copy), on either driver: what every
/// updating method of [`GuardedWrite`] runs. Refused before anything is sent when the
/// token cannot advance or the changes assign the status; one call on the connection.
pub(crate) async fn update_row<T, C, Ch>(
    conn: &mut C,
    key: &T::Key,
    expected: &TokenOf<T>,
    changes: Ch,
    stamp: T::Stamp,
    saved: Option<SavedState<T>>,
    own: bool,
) -> Result<TokenOf<T>, Error>
where
    C: Io,
    T: ReadOn<C>,
    Ch: AsChangeset<Target = T::Table>,
    UpdateOf<T, Ch::Changeset>: Assignments<C::Backend> + Send,
    for<'k> CompletionOf<T>: RunOn<C, UpdateOf<T, Ch::Changeset>, RowMoved<'k, T>, TokenOf<T>>,
{
    let call = Call::new::<C::Backend>(
        if saved.is_some() { "save" } else { "update" },
        T::table_name(),
        Some(key),
    );
    let answer = call
        .run(async move {
            let table = T::table_name();
            SavedState::refuse_move(saved.as_ref(), table, key)?;
            conn.refuse_broken()?;
            let (statement, next, miss) =
                update_in::<T, C::Backend, Ch>(table, key, expected, changes, stamp, saved)?;
            let write = CompareAndSet::one(statement, table, key, miss);
            let written = conn
                .call(async |conn: &mut C| {
                    T::check_stored_precision(conn).await?;
                    <CompletionOf<T> as RunOn<C, _, _, _>>::run(conn, write, own).await
                })
                .await?;
            Ok(written.token.unwrap_or(next))
        })
        .await;
    answer
}

/// The guarded delete of the row with `key` from `expected`, on either driver.
pub(crate) async fn delete_row<T, C>(
    conn: &mut C,
    key: &T::Key,
    expected: &TokenOf<T>,
) -> Result<(), Error>
where
    C: Io,
    T: ReadOn<C>,
    DeleteOf<T>: Assignments<C::Backend> + Send,
    for<'k> Counted: RunOn<C, DeleteOf<T>, RowMoved<'k, T>, TokenOf<T>>,
{
    let call = Call::new::<C::Backend>("delete", T::table_name(), Some(key));
    let answer = call
        .run(async move {
            conn.refuse_broken()?;
            let statement = delete_statement::<T>(key, expected);
            let miss = RowMoved::<T>::expecting(key, expected);
            let write = CompareAndSet::one(statement, T::table_name(), key, miss);
            conn.call(async |conn: &mut C| {
                <Counted as RunOn<C, _, _, _>>::run(conn, write, false).await
            })
            .await
            .map(drop)
        })
        .await;
    answer
}

/// The guard's assignments that move the row with `key` (of `table`) past `expected`, and
/// the token it then holds; [`Error::VersionOverflow`] when the token cannot advance.
pub(crate) fn advance_from_in<T: Guarded>(
    table: &'static str,
    key: &T::Key,
    expected: &TokenOf<T>,
) -> Result<(<T::Guard as GuardKind>::Advance, TokenOf<T>), Error> {
    T::Guard::advance(expected).ok_or_else(|| Error::VersionOverflow {
        table,
        key: format!("{key:?}"),
        current: T::Guard::describe(expected),
    })
}

/// A guarded update of entity `T` with changes `Ch`, and the token it moves the row to.
pub(crate) type StatementAndNext<T, Ch> = (UpdateOf<T, <Ch as AsChangeset>::Changeset>, TokenOf<T>);

/// The guarded update of the row of `table` (on backend `DB`) with `key` from `expected`
/// (in the state `kept` names, for a save), and the token it moves the row to when the
/// guard can compute it.
/// [`Error::VersionOverflow`] when the token cannot advance and
/// [`Error::StatusNotWritable`] when `changes` assign the status column: nothing is sent.
pub(crate) fn guarded_statement_in<T, DB, Ch>(
    table: &'static str,
    key: &T::Key,
    expected: &TokenOf<T>,
    changes: Ch,
    stamp: T::Stamp,
    kept: Option<T::StatusKept>,
) -> Result<StatementAndNext<T, Ch>, Error>
where
    T: Guarded,
    Ch: AsChangeset<Target = T::Table>,
    UpdateOf<T, Ch::Changeset>: Assignments<DB>,
{
    let (advance, next) = advance_from_in::<T>(table, key, expected)?;
    let statement = UpdateOf::<T, Ch::Changeset>::new(
        T::table(),
        changes.as_changeset(),
        Joined(advance, stamp, Comma),
        T::key_predicate(key),
        Joined(T::Guard::predicate(expected), kept, And),
    );
    refuse_status_write(table, T::STATUS_COLUMN, &statement, 0)?;
    Ok((statement, next))
}

/// A guarded update checked before anything is sent: the statement, the token it moves
/// the row to, and what explains a row it did not write.
pub(crate) type CheckedUpdate<'k, T, Ch> = (
    UpdateOf<T, <Ch as AsChangeset>::Changeset>,
    TokenOf<T>,
    RowMoved<'k, T>,
);

/// The guarded update of the row with `key` (of `table`) from `expected`, for a save in
/// the state of the `saved` copy: [`guarded_statement_in`], and the miss naming that
/// state. What the blocking and the async updates share.
pub(crate) fn update_in<'k, T, DB, Ch>(
    table: &'static str,
    key: &'k T::Key,
    expected: &'k TokenOf<T>,
    changes: Ch,
    stamp: T::Stamp,
    saved: Option<SavedState<T>>,
) -> Result<CheckedUpdate<'k, T, Ch>, Error>
where
    T: Guarded,
    Ch: AsChangeset<Target = T::Table>,
    UpdateOf<T, Ch::Changeset>: Assignments<DB>,
{
    let (kept, state) = SavedState::split(saved);
    let (statement, next) =
        guarded_statement_in::<T, DB, Ch>(table, key, expected, changes, stamp, kept)?;
    let miss = RowMoved::<T>::expecting(key, expected).in_state(state);
    Ok((statement, next, miss))
}

/// A write of entity `T`'s row by key alone: changes `Ch`, the token advanced in SQL,
/// under condition `G` and as long as the token can advance.
pub(crate) type KeyWriteOf<T, Ch, G> = GuardedUpdate<
    <T as diesel::associations::HasTable>::Table,
    Ch,
    AdvanceAnyOf<T>,
    <T as Guarded>::KeyPredicate,
    Joined<G, CanAdvanceOf<T>, And>,
>;

/// Sends the write by key alone `statement` (built and checked by [`key_write`]), run and
/// completed by `Done`, on either driver; `miss` explains a row it did not write.
pub(crate) async fn write_key_statement<Done, T, C, S, M>(
    conn: &mut C,
    key: &T::Key,
    statement: Result<S, Error>,
    miss: M,
) -> Result<Option<TokenOf<T>>, Error>
where
    C: Io,
    T: ReadOn<C>,
    S: Assignments<C::Backend> + Send,
    M: Send,
    Done: RunOn<C, S, M, TokenOf<T>>,
{
    let statement = statement?;
    T::check_stored_precision(conn).await?;
    let write = CompareAndSet::one(statement, T::table_name(), key, miss);
    let written = <Done as RunOn<C, _, _, _>>::run(conn, write, false).await?;
    Ok(written.token)
}

/// A write by key alone (of `table`), checked before anything is
/// sent: `changes` may assign the status column `status_assignments` times.
pub(crate) fn key_write<T, DB, Ch, G>(
    table: &'static str,
    key: &T::Key,
    changes: Ch,
    condition: G,
    status_assignments: usize,
) -> Result<KeyWriteOf<T, Ch, G>, Error>
where
    T: Guarded,
    T::Guard: AdvanceInSql,
    KeyWriteOf<T, Ch, G>: Assignments<DB>,
{
    let statement = KeyWriteOf::<T, Ch, G>::new(
        T::table(),
        changes,
        Joined(T::Guard::advance_any(), T::stamp(), Comma),
        T::key_predicate(key),
        Joined(condition, T::Guard::can_advance(), And),
    );
    refuse_status_write(table, T::STATUS_COLUMN, &statement, status_assignments)?;
    Ok(statement)
}

/// The token a write by key read back, which it must have.
pub(crate) fn token_read_back<Tok>(token: Option<Tok>) -> Result<Tok, Error> {
    token.ok_or_else(|| {
        Error::Database(DieselError::QueryBuilderError(
            "the write matched its row but did not read its new token back".into(),
        ))
    })
}

impl<T, C> Miss<C> for RowMoved<'_, T>
where
    T: LoadByKey<C>,
    C: LoadConnection,
    C::Backend: OccBackend,
{
    fn explain(self, conn: &mut C) -> Error {
        match T::load_by_key(conn, self.key()) {
            Ok(current) => match self.explained(T::table_name(), current) {
                Explanation::Done(error) => error,
                Explanation::AskIfBehind(behind) => {
                    behind.on_server(C::Backend::applies_writes_late(conn))
                }
                Explanation::AskIfLate(refusal) => {
                    let check = PrecisionCheck::again::<T, C::Backend>(T::table_name());
                    match run_precision_check(conn, check) {
                        Err(mismatch @ Error::SchemaMismatch { .. }) => mismatch,
                        _ => refusal.on_server(C::Backend::applies_writes_late(conn)),
                    }
                }
            },
            Err(e) => unreadable::<T, C>(self.key(), e).unwrap_or_else(|e| classify(conn, e)),
        }
    }
}

/// A row the re-read cannot turn back into the entity: [`Error::InvalidData`] naming the
/// guard's columns, the likely culprits (a NULL or malformed token makes the guarded
/// write match nothing, then fails the read that explains it). Other errors are handed
/// back.
pub(crate) fn unreadable<T: LoadByKey<C>, C>(
    key: &impl std::fmt::Debug,
    error: DieselError,
) -> Result<Error, DieselError> {
    unreadable_in::<T, C>(key, error, T::GUARD_COLUMNS.join(", "))
}

/// [`unreadable`], blaming `columns`.
pub(crate) fn unreadable_in<T: LoadByKey<C>, C>(
    key: &impl std::fmt::Debug,
    error: DieselError,
    columns: String,
) -> Result<Error, DieselError> {
    unreadable_row(T::table_name(), key, error, columns)
}
