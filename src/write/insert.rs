//! Guarded inserts: a row written with a first token no copy of an earlier row with the
//! same key can hold (see [`SeedsTokens`]), and a clear answer when the key is taken.

use diesel::connection::LoadConnection;
use diesel::query_builder::InsertStatement;
use diesel::query_dsl::methods::ExecuteDsl;
use diesel::result::{DatabaseErrorKind, Error as DieselError};
use diesel::Insertable;

use crate::connect::backend::OccBackend;
use crate::drive::blocking::load::LoadByKey;
use crate::drive::{now, Blocking, Io, ReadOn, RunOn};
use crate::error::Error;
use crate::flow::compare_and_set::{CompareAndSet, Matches};
use crate::guard::seed::SeedsTokens;
use crate::guard::TokenOf;
use crate::json::document::refuse_unwritable;
use crate::operation::{Insert, Operation, Run};
use crate::sql::new_token::Counted;
use crate::sql::statement::Assignments;
use crate::telemetry::Call;

use crate::drive::blocking::executor::CannotMiss;

/// The `INSERT` of entity `T`'s row.
pub(crate) type InsertOf<T> = InsertStatement<
    <T as diesel::associations::HasTable>::Table,
    <T as Insertable<<T as diesel::associations::HasTable>::Table>>::Values,
>;

/// A guarded insert of entity `Self` on connection `C`, as one bound; like
/// [`UpdateRow`](crate::UpdateRow), not a trait to implement.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot run a guarded insert on `{C}`",
    note = "the entity must also derive diesel's `Insertable` and `Clone`, and its guard must let the writer seed the first token (an `i64` version, a last-modified timestamp on the writer's clock, a pre-image)"
)]
pub trait InsertRow<C>: LoadByKey<C> {
    /// Runs the insert; [`GuardedWrite::guarded_insert`](crate::GuardedWrite::guarded_insert)
    /// calls it.
    #[doc(hidden)]
    fn insert_row(&mut self, conn: &mut C) -> Result<TokenOf<Self>, Error>;
}

impl<T, C> InsertRow<C> for T
where
    T: LoadByKey<C> + Insertable<T::Table> + Clone,
    T::Guard: SeedsTokens,
    C: LoadConnection + Send,
    C::Backend: OccBackend,
    InsertOf<T>: ExecuteDsl<C> + Assignments<C::Backend> + Send,
{
    fn insert_row(&mut self, conn: &mut C) -> Result<TokenOf<T>, Error> {
        let (row, seed) = now(insert_row(Blocking::wrap(conn), self))?;
        *self = row;
        Ok(seed)
    }
}

/// The guarded insert of `row`'s copy with a seeded first token, on either driver: the
/// copy as written and its token. A taken key is [`Error::AlreadyExists`] with the row
/// that holds it. One call on the connection.
pub(crate) async fn insert_row<T, C>(conn: &mut C, row: &T) -> Result<(T, TokenOf<T>), Error>
where
    C: Io,
    T: ReadOn<C> + Insertable<T::Table> + Clone,
    T::Guard: SeedsTokens,
    InsertOf<T>: Assignments<C::Backend> + Send,
    Counted: RunOn<C, InsertOf<T>, CannotMiss, ()>,
{
    let key = row.key();
    let call = Call::new::<C::Backend>("insert", T::table_name(), Some(&key));
    let answer = call
        .run(async move {
            conn.refuse_broken()?;
            let table = T::table_name();
            refuse_unwritable(table, row)?;
            let (row, seed) = seeded(row);
            let key = &row.key();
            let attempt = async |conn: &mut C| {
                T::check_stored_precision(conn).await?;
                let insert = diesel::insert_into(T::table()).values(row.clone());
                let write =
                    CompareAndSet::one(insert, table, key, CannotMiss).matching(Matches::Any);
                let written = <Counted as RunOn<C, _, _, ()>>::run(conn, write, false).await;
                match key_taken(written)? {
                    Ok(()) => Ok(()),
                    Err(info) => Err(taken(table, key, info, T::load_by_key(conn, key).await)),
                }
            };
            match conn.call(attempt).await {
                // The key was taken when the insert ran and is free again now (the row was
                // deleted in between), or another unique column is taken: one more run settles
                // which; nothing was written.
                Err(Error::Database(DieselError::DatabaseError(
                    DatabaseErrorKind::UniqueViolation,
                    _,
                ))) => conn.call(attempt).await?,
                done => done?,
            }
            Ok((row, seed))
        })
        .await;
    answer
}

impl<T: InsertRow<C>, C> Run<C> for Insert<T> {
    fn run(self, conn: &mut C) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        let mut row = self.row;
        let token = row.insert_row(conn)?;
        Ok((row, token))
    }
}

/// The copy of `row` to insert, with its seeded first token and stamp, and that token.
pub(crate) fn seeded<T>(row: &T) -> (T, TokenOf<T>)
where
    T: crate::guard::Guarded + Clone,
    T::Guard: SeedsTokens,
{
    let mut copy = row.clone();
    let seed = T::Guard::seed(&row.token());
    copy.set_token(seed.clone());
    copy.set_stamp(&T::stamp());
    (copy, seed)
}

/// An insert's outcome: `Ok(Ok(()))` written, `Ok(Err(info))` a unique violation (to
/// explain), or another error.
pub(crate) type InsertOutcome = Result<Result<(), ViolationInfo>, Error>;

/// What the database said of a unique violation.
pub(crate) type ViolationInfo = Box<dyn diesel::result::DatabaseErrorInformation + Send + Sync>;

/// Sorts an insert's answer: written, a unique violation to explain, or another error.
pub(crate) fn key_taken<W>(written: Result<W, Error>) -> InsertOutcome {
    match written {
        Ok(_) => Ok(Ok(())),
        Err(Error::Database(DieselError::DatabaseError(
            DatabaseErrorKind::UniqueViolation,
            info,
        ))) => Ok(Err(info)),
        Err(other) => Err(other),
    }
}

/// A unique violation on insert into `table`, given the read of the row with `key`:
/// [`Error::AlreadyExists`] with the row when the key is taken, else the violation itself
/// (another unique column).
pub(crate) fn taken<T: crate::guard::Guarded>(
    table: &'static str,
    key: &T::Key,
    info: ViolationInfo,
    read: diesel::QueryResult<Option<T>>,
) -> Error {
    match read {
        Ok(Some(current)) => Error::AlreadyExists {
            table,
            key: format!("{key:?}"),
            current: Box::new(current),
        },
        _ => Error::Database(DieselError::DatabaseError(
            DatabaseErrorKind::UniqueViolation,
            info,
        )),
    }
}
