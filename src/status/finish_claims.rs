//! Ending many claims at once: the owner-checked end of each claim, for a whole batch in
//! one statement.
//!
//! ```sql
//! UPDATE tasks SET state = ?done, owner = ?next, version = version + 1
//! WHERE id IN (?, ?, ...) AND state = ?running AND owner = ?me AND version <> ?max
//! RETURNING <the entity's columns>          -- PostgreSQL, SQLite
//! ```
//!
//! The keys it hands back are the claims that ended; any other key's claim was lost (or
//! its row is gone), and one more read per such key says why. The keys are one `IN` list
//! (`= ANY(?)` on PostgreSQL) for a key of one column. MySQL has no `RETURNING`, so the
//! statement runs in a transaction that commits when it matched every key, the usual
//! case; otherwise it rolls back and each claim is ended on its own, which tells exactly
//! which ones were still this worker's. A single key is ended on its own at once: its
//! one statement says by itself whether it matched.

use diesel::connection::LoadConnection;
use diesel::query_dsl::methods::{ExecuteDsl, LoadQuery};
use diesel::sql_types::{Nullable, Text};
use diesel::{Column, RunQueryDsl};

use crate::connect::backend::OccBackend;
use crate::connect::transaction::WriteTransaction;
use crate::drive::blocking::complete::Complete;
use crate::drive::blocking::load::LoadByKey;
use crate::drive::{now, Blocking, ExecuteOn, QueryOn, ReadOn, RunOn, Transactions};
use crate::error::Error;
use crate::flow::claim_lost::ClaimLost;
use crate::flow::compare_and_set::refuse_double_assignment;
use crate::flow::finish_claims::report::FinishedClaims;
use crate::flow::finish_claims::{Effect, FinishClaims as Flow};
use crate::guard::status::HasStatus;
use crate::guard::{AdvanceInSql, Guarded};
use crate::retry::Stop;
use crate::sql::new_token::Counted;
use crate::sql::statement::{Assignments, Returning};
use crate::status::claim::{
    check_owners, end_claim, finish_where, FinishClaim, FinishOf, FinishWhere,
};
use crate::telemetry::Call;

/// The owner-checked end of the claims on the rows of many keys.
pub(crate) type FinishManyOf<T, OwnerCol> = FinishWhere<T, OwnerCol, <T as Guarded>::KeysPredicate>;

/// The key columns of entity `T`'s table.
pub(crate) type KeyColumnsOf<T> =
    <<T as diesel::associations::HasTable>::Table as diesel::Table>::PrimaryKey;

/// [`FinishManyOf`], answering with the keys of the rows it wrote.
pub(crate) type FinishManyReturningOf<T, OwnerCol> =
    Returning<FinishManyOf<T, OwnerCol>, KeyColumnsOf<T>>;

/// The end of `owner`'s claims on the rows with `keys`.
pub(crate) fn finish_many_statement<T, OwnerCol>(
    keys: &[T::Key],
    owner: &str,
    held: T::Status,
    to: T::Status,
    next_owner: Option<&str>,
) -> FinishManyOf<T, OwnerCol>
where
    T: HasStatus,
    T::Guard: AdvanceInSql,
{
    finish_where::<T, OwnerCol, _>(T::keys_predicate(keys), owner, held, to, next_owner)
}

/// Ending many claims of rows of entity `Self` with owner column `OwnerCol` on connection
/// `C`, as one bound; like [`UpdateRow`](crate::UpdateRow), not a trait to implement.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot finish claims with `{OwnerCol}` on `{C}`",
    note = "the owner column must be a `Nullable<Text>` column of the entity's table, the entity `Selectable`, the connection a diesel connection of a backend diesel-occ supports, and the guard must advance in SQL",
    note = "on a diesel-async connection, call the async API instead: `use diesel_occ::asynchronous::prelude::*`, not `diesel_occ::prelude::*`"
)]
pub trait FinishClaims<C, OwnerCol>: HasStatus + LoadByKey<C> {
    /// Runs the end of the claims; [`GuardedClaim`](crate::GuardedClaim) calls it.
    #[doc(hidden)]
    fn finish_claims_rows(
        conn: &mut C,
        keys: &[Self::Key],
        owner: &str,
        held: Self::Status,
        to: Self::Status,
        next_owner: Option<&str>,
    ) -> Result<FinishedClaims<Self::Key>, Error>;
}

// Errors name this trait and its hints, not the first bound of the impl that fails.
#[diagnostic::do_not_recommend]
impl<T, C, OwnerCol> FinishClaims<C, OwnerCol> for T
where
    T: HasStatus + Clone + FinishClaim<C, OwnerCol>,
    T::Guard: AdvanceInSql,
    C: LoadConnection + WriteTransaction + Send,
    C::Backend: OccBackend,
    OwnerCol: Column<Table = T::Table, SqlType = Nullable<Text>>,
    FinishManyOf<T, OwnerCol>: Assignments<C::Backend> + ExecuteDsl<C> + Send,
    FinishManyReturningOf<T, OwnerCol>: RunQueryDsl<C> + LoadQuery<'static, C, T::Key> + Send,
    FinishOf<T, OwnerCol>: Assignments<C::Backend>,
    Counted: Complete<C, FinishOf<T, OwnerCol>, ()>,
{
    fn finish_claims_rows(
        conn: &mut C,
        keys: &[T::Key],
        owner: &str,
        held: T::Status,
        to: T::Status,
        next_owner: Option<&str>,
    ) -> Result<FinishedClaims<T::Key>, Error> {
        let ending = (owner, held, to, next_owner);
        now(end_claims::<T, _, OwnerCol>(
            Blocking::wrap(conn),
            keys,
            ending,
        ))
    }
}

/// How claims end: `owner`'s claims in state `held` move to `to`, handed to `next_owner`
/// or to no one.
pub(crate) type EndingOf<'a, T> = (
    &'a str,
    <T as HasStatus>::Status,
    <T as HasStatus>::Status,
    Option<&'a str>,
);

/// The end of `owner`'s claims on the rows of `keys`, on either driver: the effects the
/// flow ([`Flow`]) answers, performed.
pub(crate) async fn end_claims<T, C, OwnerCol>(
    conn: &mut C,
    keys: &[T::Key],
    (owner, held, to, next_owner): EndingOf<'_, T>,
) -> Result<FinishedClaims<T::Key>, Error>
where
    C: Transactions,
    T: HasStatus + Clone + ReadOn<C>,
    T::Guard: AdvanceInSql,
    OwnerCol: Column<Table = T::Table, SqlType = Nullable<Text>>,
    FinishManyOf<T, OwnerCol>: Assignments<C::Backend> + ExecuteOn<C> + Send,
    FinishManyReturningOf<T, OwnerCol>: QueryOn<C, T::Key> + Send,
    for<'k> Counted: RunOn<C, FinishOf<T, OwnerCol>, ClaimLost<'k, T>, ()>,
{
    let call = Call::new::<C::Backend>("finish_claims", T::table_name(), None);
    let answer = call
        .run(async move {
            check_owners(owner, next_owner)?;
            let statement = |keys: &[T::Key]| {
                finish_many_statement::<T, OwnerCol>(keys, owner, held, to, next_owner)
            };
            let table = T::table_name();
            let returning = C::Backend::RETURNING;
            let in_callers = conn.in_transaction();
            let mut flow = Flow::<T>::new(keys, table, (owner, held), returning, in_callers);
            let mut effect = flow.start();
            loop {
                effect = match effect {
                    Effect::Check(key) => {
                        conn.refuse_broken()?;
                        let checked = conn
                            .call(async |conn: &mut C| T::check_stored_precision(conn).await)
                            .await;
                        flow.checked(
                            checked
                                .and_then(|()| refuse_double_assignment(table, &statement(&[key]))),
                        )
                    }
                    Effect::SendReturning(chunk) => {
                        let key_columns = diesel::Table::primary_key(&T::table());
                        let returning = Returning::new(statement(&chunk), key_columns);
                        let sent = conn
                            .protect_caller(false, async |conn: &mut C| {
                                returning.load_on(conn).await
                            })
                            .await;
                        flow.returned(sent)
                    }
                    Effect::LookUp(key) => {
                        let row = match T::load_by_key(conn, &key).await {
                            Ok(row) => Ok(row),
                            Err(e) => Err(conn.classify(e).await),
                        };
                        flow.looked_up(row)
                    }
                    Effect::SendAllOrNothing(chunk) => {
                        let keys = chunk.len();
                        flow.all_or_nothing(every_claim_ended(conn, statement(&chunk), keys).await)
                    }
                    Effect::EndAlone(key) => {
                        let ending = (owner, held, to, next_owner);
                        flow.ended_alone(end_claim::<T, C, OwnerCol>(conn, &key, ending).await)
                    }
                    Effect::Pause(pause) => {
                        conn.pause(pause).await;
                        flow.paused()
                    }
                    Effect::Done => return flow.outcome(),
                }
            }
        })
        .await;
    answer
}

/// Sends `statement` in a transaction and commits it when it matched all `keys` rows;
/// otherwise rolls it back (`false`): a backend without `RETURNING` cannot tell which
/// claims it ended.
async fn every_claim_ended<C, S>(conn: &mut C, statement: S, keys: usize) -> Result<bool, Error>
where
    C: Transactions,
    S: ExecuteOn<C> + Send,
{
    /// Fewer rows matched than keys were given: roll back.
    struct Partial;
    let ended = conn
        .own_transaction(async |conn: &mut C| -> Result<(), Stop<Partial>> {
            let matched = match statement.execute_on(conn).await {
                Ok(matched) => matched,
                Err(e) => return Err(Stop::Occ(conn.classify(e).await)),
            };
            if matched == keys {
                Ok(())
            } else {
                Err(Stop::Caller(Partial))
            }
        })
        .await;
    match ended {
        Ok(()) => Ok(true),
        Err(Stop::Caller(Partial)) => Ok(false),
        Err(Stop::Occ(e)) => Err(e),
    }
}
