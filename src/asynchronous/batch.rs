//! Batches of guarded writes on a diesel-async connection: the blocking path's statements,
//! rounds and explanations ([`Chunk`]), awaited. On PostgreSQL the rows of a round that
//! set the same columns are one `UPDATE ... FROM (VALUES ...)`; on MySQL each row is its
//! own statement, as on the blocking path.

use std::future::Future;

use diesel::query_builder::AsChangeset;

use super::connection::{classified, classify, refuse_broken, NativeAsync, NativeAsyncConnection};
use super::entity::check_stored_precision;
use super::executor::{protect_caller, run};
use super::send::{AsyncComplete, AsyncCompleteEach, AsyncLoadByKey};
use super::transaction::{Call, OwnTransaction};
use crate::connect::backend::OccBackend;
use crate::error::Error;
use crate::guard::{CompletionOf, GuardKind, Guarded, TokenOf};
use crate::sql::new_token::Counted;
use crate::sql::statement::Assignments;
use crate::write::batch::{outcome, BatchMode, BatchReport, Chunk, Pending, RowOutcome};
use crate::write::entity::{guarded_statement_in, unreadable_row, DeleteOf, RowMoved, UpdateOf};
use crate::write::executor::{refuse_double_assignment, CompareAndSet};

/// Guarded batches on async connections; see [`GuardedBatch`](crate::GuardedBatch).
pub trait AsyncGuardedBatch: Guarded {
    /// Applies each `(key, expected token, changes)` row as a guarded update by key would,
    /// and reports every row's outcome; see
    /// [`GuardedBatch::guarded_update_batch`](crate::GuardedBatch::guarded_update_batch).
    /// Every row's statement is built and checked before anything is sent.
    fn guarded_update_batch<'a, C, Ch, I>(
        conn: &'a mut C,
        rows: I,
        mode: BatchMode,
    ) -> impl Future<Output = Result<BatchReport<TokenOf<Self>>, Error>> + Send + 'a
    where
        I: IntoIterator<Item = (Self::Key, TokenOf<Self>, Ch)>,
        Self: AsyncUpdateBatch<C, Ch>,
        Ch: 'a,
    {
        Self::update_batch(conn, rows.into_iter().collect(), mode)
    }

    /// Deletes each `(key, expected token)` row as a guarded delete by key would, and
    /// reports every row's outcome; see
    /// [`GuardedBatch::guarded_delete_batch`](crate::GuardedBatch::guarded_delete_batch).
    fn guarded_delete_batch<'a, C, I>(
        conn: &'a mut C,
        rows: I,
        mode: BatchMode,
    ) -> impl Future<Output = Result<BatchReport<()>, Error>> + Send + 'a
    where
        I: IntoIterator<Item = (Self::Key, TokenOf<Self>)>,
        Self: AsyncDeleteBatch<C>,
    {
        Self::delete_batch(conn, rows.into_iter().collect(), mode)
    }
}

impl<T: Guarded> AsyncGuardedBatch for T {}

/// A batch of guarded updates of entity `Self` with changes `Ch` on async connection `C`,
/// as one bound; not a trait to implement.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot run a batch of guarded updates with `{Ch}` on `{C}`",
    note = "the changes must be for the entity's table, the connection a diesel-async connection of a backend diesel-occ supports; on SQLite the changes must be `Send + 'static`, since the batch runs on the connection's thread"
)]
pub trait AsyncUpdateBatch<C, Ch>: Guarded {
    /// Writes the rows in `mode`, one outcome each.
    #[doc(hidden)]
    fn update_batch<'a>(
        conn: &'a mut C,
        rows: Vec<(Self::Key, TokenOf<Self>, Ch)>,
        mode: BatchMode,
    ) -> impl Future<Output = Result<BatchReport<TokenOf<Self>>, Error>> + Send + 'a
    where
        Ch: 'a;
}

/// A batch of guarded deletes of entity `Self` on async connection `C`, as one bound; not
/// a trait to implement.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot run a batch of guarded deletes on `{C}`",
    note = "the connection must be a diesel-async connection of a backend diesel-occ supports"
)]
pub trait AsyncDeleteBatch<C>: Guarded {
    /// Deletes the rows in `mode`, one outcome each.
    #[doc(hidden)]
    fn delete_batch<'a>(
        conn: &'a mut C,
        rows: Vec<(Self::Key, TokenOf<Self>)>,
        mode: BatchMode,
    ) -> impl Future<Output = Result<BatchReport<()>, Error>> + Send + 'a;
}

impl<T, C, Ch> AsyncUpdateBatch<C, Ch> for T
where
    T: AsyncLoadByKey<C>,
    C: NativeAsyncConnection,
    C::Backend: NativeAsync,
    Ch: AsChangeset<Target = T::Table> + Send,
    UpdateOf<T, Ch::Changeset>: Assignments<C::Backend> + Send,
    T::Stamp: Send,
    CompletionOf<T>: AsyncComplete<C, UpdateOf<T, Ch::Changeset>, TokenOf<T>>
        + AsyncCompleteEach<C, UpdateOf<T, Ch::Changeset>, TokenOf<T>>,
{
    async fn update_batch<'a>(
        conn: &'a mut C,
        rows: Vec<(T::Key, TokenOf<T>, Ch)>,
        mode: BatchMode,
    ) -> Result<BatchReport<TokenOf<T>>, Error>
    where
        Ch: 'a,
    {
        let table = <T as AsyncLoadByKey<C>>::table_name();
        // Every row is built and checked before anything is sent: a refused row stops the
        // batch with nothing written.
        let built = rows
            .into_iter()
            .map(|(key, expected, changes)| {
                let (update, next) = guarded_statement_in::<T, C::Backend, Ch>(
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
            .collect::<Result<Vec<_>, Error>>()?;
        if built.is_empty() {
            return Ok(BatchReport::empty());
        }
        refuse_broken(conn)?;
        let mut call = Call::start(conn);
        let report = async {
            let conn = call.conn();
            check_stored_precision::<T, C>(conn, table).await?;
            in_mode(conn, mode, async |conn, own| {
                update_rows::<T, C, _>(conn, table, built, own).await
            })
            .await
        }
        .await;
        call.finish(report)
    }
}

impl<T, C> AsyncDeleteBatch<C> for T
where
    T: AsyncLoadByKey<C>,
    C: NativeAsyncConnection,
    C::Backend: NativeAsync,
    DeleteOf<T>: Assignments<C::Backend> + Send,
    Counted: AsyncComplete<C, DeleteOf<T>, TokenOf<T>>,
{
    async fn delete_batch(
        conn: &mut C,
        rows: Vec<(T::Key, TokenOf<T>)>,
        mode: BatchMode,
    ) -> Result<BatchReport<()>, Error> {
        if rows.is_empty() {
            return Ok(BatchReport::empty());
        }
        refuse_broken(conn)?;
        let mut call = Call::start(conn);
        let report = in_mode(call.conn(), mode, async |conn, own| {
            let table = <T as AsyncLoadByKey<C>>::table_name();
            let mut outcomes = Vec::with_capacity(rows.len());
            for (key, expected) in &rows {
                let statement = DeleteOf::<T>::new(
                    T::table(),
                    T::key_predicate(key),
                    T::Guard::predicate(expected),
                );
                let miss = RowMoved::<T>::expecting(key, expected);
                let write = CompareAndSet::one(statement, table, key, miss);
                let deleted = run::<C, _, _, Counted, TokenOf<T>>(write, conn, own).await;
                outcomes.push(outcome(deleted.map(drop))?);
            }
            Ok(outcomes)
        })
        .await;
        call.finish(report)
    }
}

/// Runs a batch's rows in `mode`, as the blocking path does: as they come in a partial
/// batch (`own` false: inside the caller's transaction each statement is protected by a
/// savepoint); in an all-or-nothing one, in a transaction of the library's (a savepoint
/// inside the caller's) committed only when every row was written.
async fn in_mode<C, Tok>(
    conn: &mut C,
    mode: BatchMode,
    run: impl AsyncFnOnce(&mut C, bool) -> Result<Vec<RowOutcome<Tok>>, Error>,
) -> Result<BatchReport<Tok>, Error>
where
    C: NativeAsyncConnection,
    C::Backend: NativeAsync,
{
    match mode {
        BatchMode::Partial => Ok(BatchReport {
            rows: run(conn, false).await?,
            applied: true,
        }),
        BatchMode::AllOrNothing => {
            let mut transaction = OwnTransaction::begin(conn).await?;
            let rows = run(transaction.conn(), true).await;
            match rows {
                Ok(rows) if !rows.iter().all(RowOutcome::is_written) => {
                    match transaction.rollback().await {
                        Ok(()) => Ok(BatchReport {
                            rows,
                            applied: false,
                        }),
                        Err(e) => Err(Error::Database(e)),
                    }
                }
                rows => transaction.settle(rows).await.map(|rows| BatchReport {
                    rows,
                    applied: true,
                }),
            }
        }
    }
}

/// Writes `rows` on `conn`: on PostgreSQL a round of up to
/// [`ROWS_PER_STATEMENT`](crate::ROWS_PER_STATEMENT) rows at a time, then one read of the
/// rows the round missed; elsewhere one statement per row, each miss read as it comes.
async fn update_rows<T, C, S>(
    conn: &mut C,
    table: &'static str,
    rows: Vec<(Pending<T>, S)>,
    own: bool,
) -> Result<Vec<RowOutcome<TokenOf<T>>>, Error>
where
    T: AsyncLoadByKey<C>,
    C: NativeAsyncConnection,
    C::Backend: NativeAsync,
    S: Assignments<C::Backend> + Send,
    CompletionOf<T>: AsyncComplete<C, S, TokenOf<T>> + AsyncCompleteEach<C, S, TokenOf<T>>,
{
    let mut outcomes = Vec::with_capacity(rows.len());
    if !<C::Backend as OccBackend>::COMBINES_UPDATES {
        for (row, update) in rows {
            let (key, expected, next) = row.into_parts();
            let miss = RowMoved::<T>::expecting(&key, &expected);
            let write = CompareAndSet::one(update, table, &key, miss);
            let written = run::<C, _, _, CompletionOf<T>, TokenOf<T>>(write, conn, own).await;
            outcomes.push(outcome(written.map(|w| w.token.unwrap_or(next)))?);
        }
        return Ok(outcomes);
    }
    let mut rows = rows.into_iter().map(Ok).peekable();
    while let Some(mut chunk) = Chunk::next(&mut rows)? {
        let updates = chunk.take_updates();
        let returned = protect_caller(conn, own, async |conn| {
            CompletionOf::<T>::run_each(conn, updates).await
        })
        .await?;
        let returned = classified(conn, returned).await?;
        let written = chunk.written(table, returned)?;
        let missed = chunk.missed(&written);
        let current = if missed.is_empty() {
            Vec::new()
        } else {
            match T::load_by_keys(conn, &missed).await {
                Ok(current) => current,
                Err(e) => {
                    let columns = T::GUARD_COLUMNS.join(", ");
                    return Err(match unreadable_row(table, &missed, e, columns) {
                        Ok(unreadable) => unreadable,
                        Err(e) => classify(conn, e).await,
                    });
                }
            }
        };
        outcomes.extend(chunk.outcomes(table, written, current)?);
    }
    Ok(outcomes)
}
