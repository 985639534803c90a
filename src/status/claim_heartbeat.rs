//! Claim heartbeats: a worker that is slow but alive extends the claim it still holds, so
//! that nobody takes it over as abandoned.
//!
//! One write transaction: the row is read with a lock first (waiting there for whoever
//! holds it), then `UPDATE ... SET claimed_at = <database now>, <token advanced> WHERE
//! <key> AND status = ?held AND owner = ?me`. The new claim time is computed after the
//! wait, so a heartbeat that waited is still a whole claim from when it lands; a claim
//! another worker took over meanwhile (it changed the owner) is [`Error::LockLost`].

use diesel::connection::LoadConnection;
use diesel::sql_types::{Nullable, Text};
use diesel::Column;

use crate::connect::backend::OccBackend;
use crate::connect::transaction::WriteTransaction;
use crate::drive::blocking::complete::Complete;
use crate::drive::blocking::load::LoadByKey;
use crate::drive::{now, Blocking, ReadOn, RunOn, Transactions};
use crate::error::Error;
use crate::flow::claim_lost::ClaimLost;
use crate::flow::compare_and_set::CompareAndSet;
use crate::flow::miss::RowMoved;
use crate::guard::server_clock::{ClockColumn, Shift};
use crate::guard::status::HasStatus;
use crate::guard::AdvanceInSql;
use crate::sql::new_token::Counted;
use crate::sql::statement::{Assignments, Comma, Joined};
use crate::status::claim::{held_by, HeldBy};
use crate::telemetry::Call;
use crate::write::entity::KeyWriteOf;

/// `UPDATE ... SET claimed_at = <database now>, <token advanced> WHERE <key> AND status =
/// ?held AND owner = ?me`.
pub(crate) type HeartbeatOf<T, OwnerCol, AtCol> =
    KeyWriteOf<T, ClockColumn<AtCol>, HeldBy<T, OwnerCol>>;

/// A heartbeat of a claim on a row of entity `Self` with owner column `OwnerCol` and
/// claim-time column `AtCol` on connection `C`, as one bound; like
/// [`UpdateRow`](crate::UpdateRow), not a trait to implement.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot extend a claim with `{OwnerCol}` and `{AtCol}` on `{C}`",
    note = "the owner column must be `Nullable<Text>` and the claim time a timestamp column of the entity's table, the connection a diesel connection of a backend diesel-occ supports, and the guard must advance in SQL",
    note = "on a diesel-async connection, call the async API instead: `use diesel_occ::asynchronous::prelude::*`, not `diesel_occ::prelude::*`"
)]
pub trait ExtendClaim<C, OwnerCol, AtCol>: HasStatus + LoadByKey<C> {
    /// Runs the heartbeat; [`GuardedClaim`](crate::GuardedClaim) calls it.
    #[doc(hidden)]
    fn extend_claim_row(
        conn: &mut C,
        key: &Self::Key,
        owner: &str,
        held: Self::Status,
    ) -> Result<Self, Error>;
}

// Errors name this trait and its hints, not the first bound of the impl that fails.
#[diagnostic::do_not_recommend]
impl<T, C, OwnerCol, AtCol> ExtendClaim<C, OwnerCol, AtCol> for T
where
    T: HasStatus + LoadByKey<C>,
    T::Guard: AdvanceInSql,
    C: LoadConnection + WriteTransaction + Send,
    C::Backend: OccBackend,
    OwnerCol: Column<Table = T::Table, SqlType = Nullable<Text>>,
    AtCol: Column<Table = T::Table>,
    HeartbeatOf<T, OwnerCol, AtCol>: Assignments<C::Backend>,
    Counted: Complete<C, HeartbeatOf<T, OwnerCol, AtCol>, ()>,
{
    fn extend_claim_row(
        conn: &mut C,
        key: &T::Key,
        owner: &str,
        held: T::Status,
    ) -> Result<T, Error> {
        now(extend_claim::<T, _, OwnerCol, AtCol>(
            Blocking::wrap(conn),
            key,
            owner,
            held,
        ))
    }
}

/// The heartbeat of `owner`'s claim on the row with `key` (in state `held`), on either
/// driver: one write transaction that reads the row with a lock (waiting for whoever
/// holds it, so the claim time is computed after the wait), moves the claim time and
/// reads the row back.
pub(crate) async fn extend_claim<T, C, OwnerCol, AtCol>(
    conn: &mut C,
    key: &T::Key,
    owner: &str,
    held: T::Status,
) -> Result<T, Error>
where
    C: Transactions,
    T: HasStatus + ReadOn<C>,
    T::Guard: AdvanceInSql,
    OwnerCol: Column<Table = T::Table, SqlType = Nullable<Text>>,
    AtCol: Column<Table = T::Table>,
    for<'k> Counted: RunOn<C, HeartbeatOf<T, OwnerCol, AtCol>, ClaimLost<'k, T>, ()>,
{
    let call = Call::new::<C::Backend>("extend_claim", T::table_name(), Some(key));
    call.run_reporting(
        async move {
            crate::sql::names::check_name("owner", owner)?;
            conn.refuse_broken()?;
            T::check_stored_precision(conn).await?;
            let table = T::table_name();
            conn.own_transaction(async |conn: &mut C| {
                if let Err(e) = T::load_by_key(conn, key).await {
                    return Err(conn.classify(e).await);
                }
                let statement = heartbeat_statement::<T, OwnerCol, AtCol>(key, owner, held);
                let miss = ClaimLost::<T> { key, owner, held };
                let write = CompareAndSet::one(statement, table, key, miss);
                <Counted as RunOn<C, _, _, ()>>::run(conn, write, true).await?;
                match T::load_by_key(conn, key).await {
                    Ok(Some(row)) => Ok(row),
                    Ok(None) => Err(RowMoved::<T>::any(key).given_in(table, None)),
                    Err(e) => Err(conn.classify(e).await),
                }
            })
            .await
        },
        |answer| {
            if answer.is_ok() {
                crate::telemetry::claim_heartbeat(T::table_name(), owner, 1);
            }
        },
    )
    .await
}

/// The heartbeat of `owner`'s claim on the row with `key` (in state `held`).
pub(crate) fn heartbeat_statement<T, OwnerCol, AtCol>(
    key: &T::Key,
    owner: &str,
    held: T::Status,
) -> HeartbeatOf<T, OwnerCol, AtCol>
where
    T: HasStatus,
    T::Guard: AdvanceInSql,
{
    HeartbeatOf::<T, OwnerCol, AtCol>::new(
        T::table(),
        ClockColumn::set(Shift::none()),
        Joined(T::Guard::advance_any(), T::stamp(), Comma),
        T::key_predicate(key),
        held_by::<T, OwnerCol>(owner, held),
    )
}
