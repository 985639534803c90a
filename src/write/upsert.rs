//! Guarded upserts: save a copy over its row when the row still holds the copy's token,
//! or insert it when no row has its key; every other case is the outcome a save or an
//! insert would give.
//!
//! The update goes first (one statement when the row is there, the common case of a
//! `PUT`), and a miss is not explained by a read: the insert that follows finds out
//! whether the row is missing (it writes it) or there under another token (its key is
//! taken, and the row it then reads explains the miss as a save would). So an insert
//! costs two statements and a conflict three; nothing is ever written over a row whose
//! token the caller did not hold, and a row inserted by someone else between the two
//! statements is a conflict, not overwritten.

use diesel::connection::LoadConnection;
use diesel::query_builder::AsChangeset;

use crate::connect::backend::OccBackend;
use crate::telemetry::Call;
use diesel::Insertable;

use crate::drive::blocking::complete::Complete;
use crate::drive::blocking::executor::CannotMiss;
use crate::drive::{now, Blocking, Io, ReadOn, RunOn};
use crate::error::Error;
use crate::flow::compare_and_set::CompareAndSet;
use crate::flow::miss::RowMoved;
use crate::guard::seed::SeedsTokens;
use crate::guard::{Advancing, CompletionOf, TokenOf};
use crate::json::document::refuse_unwritable;
use crate::operation::{Operation, Run, Upsert};
use crate::sql::new_token::Counted;
use crate::sql::statement::Assignments;
use crate::write::insert::{insert_row, InsertOf};

use crate::drive::blocking::executor::Miss;
use crate::write::entity::{guarded_statement_in, UpdateOf};
use crate::write::insert::InsertRow;

pub use crate::operation::insert::Upserted;

/// A guarded upsert of entity `Self` on connection `C`, as one bound; like
/// [`UpdateRow`](crate::UpdateRow), not a trait to implement.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot run a guarded upsert on `{C}`",
    note = "an upsert saves the copy or inserts it: the entity must derive diesel's `Insertable` and `Clone`, and its guard must advance (a version or a last-modified timestamp; a pre-image copy cannot prove itself once modified)"
)]
pub trait UpsertRow<C>: InsertRow<C> {
    /// Runs the upsert; [`GuardedWrite::guarded_upsert`](crate::GuardedWrite::guarded_upsert)
    /// calls it.
    #[doc(hidden)]
    fn upsert_row(&mut self, conn: &mut C) -> Result<Upserted<TokenOf<Self>>, Error>;
}

impl<T, C> UpsertRow<C> for T
where
    T: InsertRow<C> + Insertable<T::Table> + Clone,
    T::Guard: Advancing + SeedsTokens,
    C: LoadConnection + Send,
    C::Backend: OccBackend,
    T::Changes: AsChangeset<Target = T::Table>,
    UpdateOf<T, <T::Changes as AsChangeset>::Changeset>: Assignments<C::Backend> + Send,
    CompletionOf<T>: Complete<C, UpdateOf<T, <T::Changes as AsChangeset>::Changeset>, TokenOf<T>>,
    InsertOf<T>: Assignments<C::Backend> + Send,
    Counted: Complete<C, InsertOf<T>, ()>,
{
    fn upsert_row(&mut self, conn: &mut C) -> Result<Upserted<TokenOf<T>>, Error> {
        now(upsert_row(Blocking::wrap(conn), self))
    }
}

/// The guarded upsert of `row`, on either driver: saved over its row if the row still
/// holds its token (the statement built and checked before anything is sent), else
/// inserted with a seeded first token; `row` records what was written.
pub(crate) async fn upsert_row<T, C>(
    conn: &mut C,
    row: &mut T,
) -> Result<Upserted<TokenOf<T>>, Error>
where
    C: Io,
    T: ReadOn<C> + Insertable<T::Table> + Clone,
    T::Guard: Advancing + SeedsTokens,
    T::Changes: AsChangeset<Target = T::Table>,
    UpdateOf<T, <T::Changes as AsChangeset>::Changeset>: Assignments<C::Backend> + Send,
    CompletionOf<T>:
        RunOn<C, UpdateOf<T, <T::Changes as AsChangeset>::Changeset>, Unexplained, TokenOf<T>>,
    InsertOf<T>: Assignments<C::Backend> + Send,
    Counted: RunOn<C, InsertOf<T>, CannotMiss, ()>,
{
    let key = row.key();
    let call = Call::new::<C::Backend>("upsert", T::table_name(), Some(&key));
    let answer = call
        .run(async move {
            conn.refuse_broken()?;
            let table = T::table_name();
            refuse_unwritable(table, row)?;
            let (key, expected, stamp) = (row.key(), row.token(), T::stamp());
            let (statement, next) = guarded_statement_in::<T, C::Backend, T::Changes>(
                table,
                &key,
                &expected,
                row.changes(),
                stamp.clone(),
                Some(row.status_kept()),
            )?;
            let write = CompareAndSet::one(statement, table, &key, Unexplained);
            let updated = conn
                .call(async |conn: &mut C| {
                    T::check_stored_precision(conn).await?;
                    <CompletionOf<T> as RunOn<C, _, _, _>>::run(conn, write, false).await
                })
                .await;
            if let Some(done) = saved_over(row, updated, next, &stamp)? {
                return Ok(done);
            }
            let state = row.status_name();
            let inserted = insert_row(conn, row).await.map(|(copy, seed)| {
                *row = copy;
                seed
            });
            inserted_or_conflict::<T>(table, &key, &expected, state, inserted)
        })
        .await;
    answer
}

impl<T: UpsertRow<C>, C> Run<C> for Upsert<T> {
    fn run(self, conn: &mut C) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        let mut row = self.row;
        let answer = row.upsert_row(conn)?;
        Ok((row, answer))
    }
}

/// The upsert's answer after its update: `Some` when the update wrote the row (recorded
/// in `row`, with the token `next` unless the database read one back), `None` when no row
/// matched (the insert decides), or the update's error.
pub(crate) fn saved_over<T: crate::guard::Guarded>(
    row: &mut T,
    updated: Result<crate::flow::compare_and_set::Written<TokenOf<T>>, Error>,
    next: TokenOf<T>,
    stamp: &T::Stamp,
) -> Result<Option<Upserted<TokenOf<T>>>, Error> {
    match updated {
        Ok(written) => {
            let token = written.token.unwrap_or(next);
            row.set_token(token.clone());
            row.set_stamp(stamp);
            Ok(Some(Upserted::Updated(token)))
        }
        Err(Error::NotFound { .. }) => Ok(None),
        Err(other) => Err(other),
    }
}

/// The upsert's answer after its insert: inserted, or the insert's [`failure`](insert_failed).
pub(crate) fn inserted_or_conflict<T: crate::guard::Guarded>(
    table: &'static str,
    key: &T::Key,
    expected: &TokenOf<T>,
    state: Option<&'static str>,
    inserted: Result<TokenOf<T>, Error>,
) -> Result<Upserted<TokenOf<T>>, Error> {
    inserted
        .map(Upserted::Inserted)
        .map_err(|error| insert_failed::<T>(table, key, expected, state, error))
}

/// What an upsert whose insert failed with `error` answers: when someone else's row has
/// the key, the conflict a save would report with that row; otherwise `error`.
pub(crate) fn insert_failed<T: crate::guard::Guarded>(
    table: &'static str,
    key: &T::Key,
    expected: &TokenOf<T>,
    state: Option<&'static str>,
    error: Error,
) -> Error {
    match error {
        Error::AlreadyExists { current, .. } => {
            let current = current.into_any().downcast::<T>().ok().map(|row| *row);
            RowMoved::<T>::expecting(key, expected)
                .in_state(state)
                .given_in(table, current)
        }
        other => other,
    }
}

/// A missed update of an upsert, left for the insert to explain: an [`Error::NotFound`]
/// the upsert takes as "try the insert", without reading the row.
pub(crate) struct Unexplained;

impl<C> Miss<C> for Unexplained {
    fn explain(self, _: &mut C) -> Error {
        Error::NotFound {
            table: "",
            key: String::new(),
        }
    }
}
