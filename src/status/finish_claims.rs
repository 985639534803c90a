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
use crate::connect::caller_transaction::protect_caller;
use crate::connect::transaction::in_transaction;
use crate::connect::transaction::{commit_operation, WriteTransaction};
use crate::error::Error;
use crate::flow::compare_and_set::refuse_double_assignment;
use crate::flow::finish_claims::report::FinishedClaims;
use crate::flow::finish_claims::{Effect, FinishClaims as Flow};
use crate::guard::status::HasStatus;
use crate::guard::{AdvanceInSql, Guarded};
use crate::retry::Stop;
use crate::sql::statement::{Assignments, Returning};
use crate::status::claim::{check_owners, finish_where, FinishClaim, FinishWhere};
use crate::write::entity::check_stored_precision;
use crate::write::entity::LoadByKey;
use crate::write::executor::classify;

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
    note = "the owner column must be a `Nullable<Text>` column of the entity's table, the entity `Selectable`, the connection a diesel connection of a backend diesel-occ supports, and the guard must advance in SQL"
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

impl<T, C, OwnerCol> FinishClaims<C, OwnerCol> for T
where
    T: HasStatus + Clone + FinishClaim<C, OwnerCol>,
    T::Guard: AdvanceInSql,
    C: LoadConnection + WriteTransaction,
    C::Backend: OccBackend,
    OwnerCol: Column<Table = T::Table, SqlType = Nullable<Text>>,
    FinishManyOf<T, OwnerCol>: Assignments<C::Backend> + ExecuteDsl<C>,
    FinishManyReturningOf<T, OwnerCol>: LoadQuery<'static, C, T::Key>,
{
    fn finish_claims_rows(
        conn: &mut C,
        keys: &[T::Key],
        owner: &str,
        held: T::Status,
        to: T::Status,
        next_owner: Option<&str>,
    ) -> Result<FinishedClaims<T::Key>, Error> {
        check_owners(owner, next_owner)?;
        let statement = |keys: &[T::Key]| {
            finish_many_statement::<T, OwnerCol>(keys, owner, held, to, next_owner)
        };
        let in_callers = in_transaction(conn);
        let returning = C::Backend::RETURNING;
        let mut flow = Flow::<T>::new(keys, T::table_name(), (owner, held), returning, in_callers);
        let mut effect = flow.start();
        loop {
            effect = match effect {
                Effect::Check(key) => {
                    flow.checked(check_stored_precision::<T, C>(conn).and_then(|()| {
                        refuse_double_assignment(T::table_name(), &statement(&[key]))
                    }))
                }
                Effect::SendReturning(chunk) => {
                    let key_columns = diesel::Table::primary_key(&T::table());
                    let returning = Returning::new(statement(&chunk), key_columns);
                    let sent = protect_caller(conn, false, |conn| returning.load(conn));
                    flow.returned(sent.map_err(|e| classify(conn, e)))
                }
                Effect::LookUp(key) => {
                    flow.looked_up(T::load_by_key(conn, &key).map_err(|e| classify(conn, e)))
                }
                Effect::SendAllOrNothing(chunk) => {
                    let keys = chunk.len();
                    flow.all_or_nothing(every_claim_ended(conn, statement(&chunk), keys))
                }
                Effect::EndAlone(key) => {
                    flow.ended_alone(T::finish_claim_row(conn, &key, owner, held, to, next_owner))
                }
                Effect::Pause(pause) => {
                    std::thread::sleep(pause);
                    flow.paused()
                }
                Effect::Done => return flow.outcome(),
            }
        }
    }
}

/// Sends `statement` in a transaction and commits it when it matched all `keys` rows;
/// otherwise rolls it back (`false`): a backend without `RETURNING` cannot tell which
/// claims it ended.
fn every_claim_ended<C, S>(conn: &mut C, statement: S, keys: usize) -> Result<bool, Error>
where
    C: LoadConnection + WriteTransaction,
    C::Backend: OccBackend,
    S: ExecuteDsl<C>,
{
    /// Fewer rows matched than keys were given: roll back.
    struct Partial;
    let ended = commit_operation(conn, |conn| -> Result<(), Stop<Partial>> {
        let matched =
            ExecuteDsl::execute(statement, conn).map_err(|e| Stop::Occ(classify(conn, e)))?;
        if matched == keys {
            Ok(())
        } else {
            Err(Stop::Caller(Partial))
        }
    });
    match ended {
        Ok(()) => Ok(true),
        Err(Stop::Caller(Partial)) => Ok(false),
        Err(Stop::Occ(e)) => Err(e),
    }
}
