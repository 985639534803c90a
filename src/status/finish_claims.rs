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
use crate::flow::finish_claims::{Effect, FinishClaims as Flow};
use crate::guard::{AdvanceInSql, Guarded};
use crate::retry::Stop;
use crate::sql::statement::{Assignments, Returning};
use crate::status::claim::{check_owners, finish_where, ClaimLost, FinishClaim, FinishWhere};
use crate::status::HasStatus;
use crate::write::entity::check_stored_precision;
use crate::write::entity::LoadByKey;
use crate::write::executor::{classify, refuse_double_assignment};

/// What ending a batch of claims did, key by key (each key once, in the order given).
#[derive(Debug)]
pub struct FinishedClaims<K> {
    /// The claims that ended: these rows were this worker's and are now in the new state.
    pub finished: Vec<K>,
    /// The claims that had already been lost, each with why: [`Error::LockLost`] (another
    /// worker took the row over, or it left the held state), [`Error::NotFound`] (the row
    /// is gone) or [`Error::VersionOverflow`] (its version cannot advance).
    pub lost: Vec<(K, Error)>,
}

impl<K> FinishedClaims<K> {
    /// Whether every claim ended.
    pub fn all_finished(&self) -> bool {
        self.lost.is_empty()
    }
}

impl<K> Default for FinishedClaims<K> {
    fn default() -> Self {
        FinishedClaims {
            finished: Vec::new(),
            lost: Vec::new(),
        }
    }
}

/// Keys per statement. A key of several columns is an `OR` chain of the keys, which
/// SQLite parses as an expression tree as deep as the chain (at most 1,000 by default: 996
/// keys fail); the bound parameters stay far below every backend's limit for keys of up
/// to 16 columns. A one-column key needs no split (an `IN` list, one array on
/// PostgreSQL), but the same size keeps each statement's locks and reply short.
pub(crate) const KEYS_PER_STATEMENT: usize = 500;

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

/// `keys` without repeats, in their first order. Keys are only `PartialEq`, so this is
/// quadratic: meant for a batch a worker claimed (hundreds of keys), not for a table.
pub(crate) fn distinct<K: PartialEq + Clone>(keys: &[K]) -> Vec<K> {
    let mut seen: Vec<K> = Vec::with_capacity(keys.len());
    for key in keys {
        if !seen.contains(key) {
            seen.push(key.clone());
        }
    }
    seen
}

impl<K: PartialEq + Clone + std::fmt::Debug> FinishedClaims<K> {
    /// Adds the outcome for `key`, which is not among the keys of the rows the statement
    /// wrote (`ended`, as stored): `current` is the row the database finds by `key` now
    /// (in `table`). It is finished if that row is one of them after all (a key the
    /// database compares more loosely than `==`), otherwise lost, and why.
    pub(crate) fn add_looked_up<T>(
        &mut self,
        table: &'static str,
        key: &K,
        ended: &[K],
        current: Option<T>,
        claim: (&str, T::Status),
    ) where
        T: HasStatus<Key = K>,
        T::Guard: AdvanceInSql,
    {
        let (owner, held) = claim;
        match current {
            Some(row) if ended.contains(&row.key()) => self.finished.push(key.clone()),
            row => {
                let why = ClaimLost::<T> { key, owner, held }.given(table, row);
                self.lost.push((key.clone(), why));
            }
        }
    }

    /// Adds the outcome of ending the claim on `key` alone: finished, lost, or an error
    /// that is not about the row (handed back).
    pub(crate) fn add_alone(&mut self, key: &K, ended: Result<(), Error>) -> Result<(), Error> {
        match ended {
            Ok(()) => self.finished.push(key.clone()),
            Err(
                why @ (Error::LockLost { .. }
                | Error::NotFound { .. }
                | Error::VersionOverflow { .. }),
            ) => self.lost.push((key.clone(), why)),
            Err(other) => return Err(other),
        }
        Ok(())
    }
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
