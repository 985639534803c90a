//! Claims that count attempts: every claim of a row adds one to its attempt column, and a
//! row that used up its attempts is parked instead of handed out again, so a row that
//! crashes every worker that takes it (a poison row) does not loop for ever.
//!
//! One write transaction, as for a plain claim: the claimable rows are read with their
//! attempt counts (`FOR UPDATE SKIP LOCKED`), then those with attempts left are handed
//! to the worker (`attempts = attempts + 1`) and the others moved to the parking state
//! with their owner cleared, each by one `UPDATE` of the rows the read locked. Parked rows
//! count toward the limit and come back separately ([`Claimed::parked`]), for the worker
//! to log or alert on; call again for more work.

use diesel::connection::LoadConnection;
use diesel::dsl::AsSelect;
use diesel::query_dsl::methods::LoadQuery;
use diesel::sql_types::{Integer, Nullable, Text};
use diesel::{Column, Selectable, SelectableHelper};

use crate::connect::backend::OccBackend;
use crate::connect::transaction::WriteTransaction;
use crate::drive::blocking::complete::Complete;
use crate::drive::blocking::load::LoadByKey;
use crate::drive::{now, Blocking, QueryOn, ReadOn, RunOn, Transactions};
use crate::error::Error;
use crate::flow::claim_lost::ClaimIgnored;
use crate::guard::status::{HasStatus, Status};
use crate::guard::{AdvanceInSql, Guarded};
use crate::sql::new_token::Counted;
use crate::sql::statement::{Assignments, ColumnEq, Comma, Increment, Joined};
use crate::status::claim::{
    check_claimed_by, claim_changes, write_locked, ClaimChanges, ClaimRequest, Claimable,
    ClaimableOf, OwnersOf,
};
use crate::status::claim_filter::ClaimFilter;
use crate::status::claimable_rows::ClaimableRows;
use crate::telemetry::Call;
use crate::write::bulk::BulkUpdateOf;

/// How many times a row may be claimed, and where it goes when it was claimed that often.
#[derive(Debug, Clone, Copy)]
pub struct AttemptLimit<S> {
    /// The claims a row may get (at least 1). A claimable row whose attempt count reached
    /// it is parked instead of claimed.
    pub max: i32,
    /// The state parked rows move to (their owner cleared); neither the request's `from`
    /// nor its `to`.
    pub park_in: S,
}

/// What a counted claim took: the rows handed to the worker, and the rows it parked
/// because they used up their attempts, each as written.
#[derive(Debug, Clone, PartialEq)]
pub struct Claimed<T> {
    /// Claimed by this worker, attempt counts raised by one.
    pub rows: Vec<T>,
    /// Moved to the parking state.
    pub parked: Vec<T>,
}

/// The claimable rows of `T` with their attempt counts, at most a limit, locked and
/// skipping locked ones.
pub(crate) type CountedClaimQueryOf<T, AtCol, AttemptsCol, DB> = ClaimableRows<
    <T as diesel::associations::HasTable>::Table,
    (AsSelect<T, DB>, AttemptsCol),
    ClaimableOf<T, AtCol>,
>;

/// The claim's `UPDATE`, counting the attempt.
pub(crate) type CountedClaimOf<T, OwnerCol, AtCol, AttemptsCol> = BulkUpdateOf<
    T,
    Joined<ClaimChanges<T, OwnerCol, AtCol>, Increment<AttemptsCol>, Comma>,
    <T as Guarded>::KeysPredicate,
>;

/// `UPDATE ... SET status = ?parked, owner = NULL, <token advanced>` of rows out of
/// attempts.
pub(crate) type ParkOf<T, OwnerCol> = BulkUpdateOf<
    T,
    Joined<
        ColumnEq<<T as HasStatus>::StatusColumn, <T as HasStatus>::Status>,
        ColumnEq<OwnerCol, Option<String>>,
        Comma,
    >,
    <T as Guarded>::KeysPredicate,
>;

/// A counted claim of rows of entity `Self` with owner column `OwnerCol`, claim-time
/// column `AtCol` and attempt column `AttemptsCol` on connection `C`, as one bound; like
/// [`UpdateRow`](crate::UpdateRow), not a trait to implement.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot claim rows counting attempts in `{AttemptsCol}` on `{C}`",
    note = "the owner column must be `Nullable<Text>`, the claim time a timestamp column and the attempt column an `Integer` column of the entity's table, the entity `Selectable`, the connection a diesel connection of a backend diesel-occ supports, and the guard must advance in SQL",
    note = "on a diesel-async connection, call the async API instead: `use diesel_occ::asynchronous::prelude::*`, not `diesel_occ::prelude::*`"
)]
pub trait ClaimCounted<C, OwnerCol, AtCol, AttemptsCol>: HasStatus + Clone + LoadByKey<C> {
    /// Runs the claim; [`GuardedClaim`](crate::GuardedClaim) calls it.
    #[doc(hidden)]
    fn claim_counted_rows(
        conn: &mut C,
        request: &ClaimRequest<'_, Self::Status>,
        limit: &AttemptLimit<Self::Status>,
        filter: Option<&ClaimFilter>,
    ) -> Result<Claimed<Self>, Error>;
}

// Errors name this trait and its hints, not the first bound of the impl that fails.
#[diagnostic::do_not_recommend]
impl<T, C, OwnerCol, AtCol, AttemptsCol> ClaimCounted<C, OwnerCol, AtCol, AttemptsCol> for T
where
    T: HasStatus + Clone,
    T::Guard: AdvanceInSql,
    C: LoadConnection + WriteTransaction + Send,
    C::Backend: OccBackend,
    OwnerCol: Column<Table = T::Table, SqlType = Nullable<Text>>,
    AtCol: Column<Table = T::Table>,
    AttemptsCol: Column<Table = T::Table, SqlType = Integer> + Default,
    T: LoadByKey<C> + Selectable<C::Backend>,
    CountedClaimQueryOf<T, AtCol, AttemptsCol, C::Backend>: LoadQuery<'static, C, (T, i32)>,
    CountedClaimOf<T, OwnerCol, AtCol, AttemptsCol>: Assignments<C::Backend>,
    ParkOf<T, OwnerCol>: Assignments<C::Backend>,
    Counted: Complete<C, CountedClaimOf<T, OwnerCol, AtCol, AttemptsCol>, ()>
        + Complete<C, ParkOf<T, OwnerCol>, ()>,
    OwnerCol: Default,
    T::Table: diesel::query_dsl::methods::FilterDsl<T::KeysPredicate>,
    diesel::dsl::Filter<T::Table, T::KeysPredicate>:
        diesel::query_dsl::methods::SelectDsl<OwnerCol>,
    OwnersOf<T, OwnerCol>: LoadQuery<'static, C, Option<String>> + Send,
{
    fn claim_counted_rows(
        conn: &mut C,
        request: &ClaimRequest<'_, T::Status>,
        limit: &AttemptLimit<T::Status>,
        filter: Option<&ClaimFilter>,
    ) -> Result<Claimed<T>, Error> {
        now(claim_counted::<T, _, OwnerCol, AtCol, AttemptsCol>(
            Blocking::wrap(conn),
            request,
            limit,
            filter,
        ))
    }
}

/// The counted claim, on either driver: one write transaction that reads the claimable
/// rows with their attempt counts (locked, skipping other workers' rows), parks the rows
/// out of attempts and hands the others over.
pub(crate) async fn claim_counted<T, C, OwnerCol, AtCol, AttemptsCol>(
    conn: &mut C,
    request: &ClaimRequest<'_, T::Status>,
    limit: &AttemptLimit<T::Status>,
    filter: Option<&ClaimFilter>,
) -> Result<Claimed<T>, Error>
where
    C: Transactions,
    T: HasStatus + Clone + ReadOn<C> + Selectable<C::Backend>,
    T::Guard: AdvanceInSql,
    OwnerCol: Column<Table = T::Table, SqlType = Nullable<Text>>,
    AtCol: Column<Table = T::Table>,
    AttemptsCol: Column<Table = T::Table, SqlType = Integer> + Default,
    CountedClaimQueryOf<T, AtCol, AttemptsCol, C::Backend>: QueryOn<C, (T, i32)>,
    for<'k> Counted: RunOn<C, CountedClaimOf<T, OwnerCol, AtCol, AttemptsCol>, ClaimIgnored<'k, T>, ()>
        + RunOn<C, ParkOf<T, OwnerCol>, ClaimIgnored<'k, T>, ()>,
    OwnerCol: Default,
    T::Table: diesel::query_dsl::methods::FilterDsl<T::KeysPredicate>,
    diesel::dsl::Filter<T::Table, T::KeysPredicate>:
        diesel::query_dsl::methods::SelectDsl<OwnerCol>,
    OwnersOf<T, OwnerCol>: QueryOn<C, Option<String>> + Send,
{
    let call = Call::new::<C::Backend>("claim_counted", T::table_name(), None);
    call.run_reporting(
        async move {
            crate::sql::names::check_name("owner", request.owner)?;
            check_limit(request, limit)?;
            if request.limit == 0 {
                return Ok(nothing_claimed());
            }
            conn.refuse_broken()?;
            conn.own_transaction(async |conn: &mut C| {
                let query =
                    counted_claim_query::<T, AtCol, AttemptsCol, C::Backend>(request, filter);
                let waiting: Vec<(T, i32)> = match query.load_on(conn).await {
                    Ok(rows) => rows,
                    Err(e) => return Err(conn.classify(e).await),
                };
                let (spent, fresh) = split_spent(waiting, limit);
                let parked = write_locked(conn, &spent, limit.park_in, |keys| {
                    park_statement::<T, OwnerCol>(limit.park_in, keys)
                })
                .await?;
                let rows = write_locked(conn, &fresh, request.to, |keys| {
                    hand_over_statement::<T, OwnerCol, AtCol, AttemptsCol>(request, keys)
                })
                .await?;
                // Only where a cluster node can roll a transaction back unseen (MySQL: Galera).
                if !C::Backend::RETURNING {
                    check_claimed_by::<T, C, OwnerCol>(conn, &rows, request.owner).await?;
                }
                Ok(Claimed { rows, parked })
            })
            .await
        },
        |answer| {
            if let Ok(claimed) = answer {
                crate::telemetry::claimed(T::table_name(), request.owner, claimed.rows.len());
                crate::telemetry::parked(T::table_name(), request.owner, claimed.parked.len());
            }
        },
    )
    .await
}

/// The read of up to `request.limit` rows `request` may claim with their attempt counts,
/// locked, skipping rows other workers hold.
pub(crate) fn counted_claim_query<T, AtCol, AttemptsCol, DB>(
    request: &ClaimRequest<'_, T::Status>,
    filter: Option<&ClaimFilter>,
) -> CountedClaimQueryOf<T, AtCol, AttemptsCol, DB>
where
    T::Guard: AdvanceInSql,
    T: HasStatus + Selectable<DB>,
    DB: diesel::backend::Backend,
    AttemptsCol: Default,
{
    let filter = Claimable::of(request, filter, T::Guard::can_advance());
    let select = (T::as_select(), AttemptsCol::default());
    ClaimableRows::new(T::table(), select, filter, request.order, request.limit)
}

/// The rows read that used up their attempts, to park, and the others, to hand over.
pub(crate) fn split_spent<T, S>(
    waiting: Vec<(T, i32)>,
    limit: &AttemptLimit<S>,
) -> (Vec<T>, Vec<T>) {
    let (spent, fresh): (Vec<_>, Vec<_>) = waiting
        .into_iter()
        .partition(|(_, attempts)| *attempts >= limit.max);
    let rows = |read: Vec<(T, i32)>| read.into_iter().map(|(row, _)| row).collect();
    (rows(spent), rows(fresh))
}

/// A counted claim with nothing to do: an empty request.
pub(crate) fn nothing_claimed<T>() -> Claimed<T> {
    Claimed {
        rows: Vec::new(),
        parked: Vec::new(),
    }
}

/// At least one attempt, and a parking state apart from the claim's two states.
pub(crate) fn check_limit<S: Status>(
    request: &ClaimRequest<'_, S>,
    limit: &AttemptLimit<S>,
) -> Result<(), Error> {
    let invalid = |reason: String| {
        Err(Error::InvalidSetting {
            what: "attempt limit",
            reason,
        })
    };
    if limit.max < 1 {
        return invalid(format!("at least one attempt is needed, not {}", limit.max));
    }
    if limit.park_in == request.from || limit.park_in == request.to {
        return invalid(format!(
            "parked rows must leave the claim's states (`{}`, `{}`), not stay in `{}`",
            request.from.name(),
            request.to.name(),
            limit.park_in.name()
        ));
    }
    Ok(())
}

/// The `UPDATE` handing the rows with `keys` to the request's owner, counting the attempt.
pub(crate) fn hand_over_statement<T, OwnerCol, AtCol, AttemptsCol>(
    request: &ClaimRequest<'_, T::Status>,
    keys: T::KeysPredicate,
) -> CountedClaimOf<T, OwnerCol, AtCol, AttemptsCol>
where
    T: HasStatus,
    T::Guard: AdvanceInSql,
{
    CountedClaimOf::<T, OwnerCol, AtCol, AttemptsCol>::new(
        T::table(),
        Joined(
            claim_changes::<T, OwnerCol, AtCol>(request),
            Increment::default(),
            Comma,
        ),
        Joined(T::Guard::advance_any(), T::stamp(), Comma),
        keys,
        T::Guard::can_advance(),
    )
}

/// The `UPDATE` moving the rows with `keys` to `park_in`, their owner cleared.
pub(crate) fn park_statement<T, OwnerCol>(
    park_in: T::Status,
    keys: T::KeysPredicate,
) -> ParkOf<T, OwnerCol>
where
    T: HasStatus,
    T::Guard: AdvanceInSql,
{
    ParkOf::<T, OwnerCol>::new(
        T::table(),
        Joined(ColumnEq::new(park_in), ColumnEq::new(None), Comma),
        Joined(T::Guard::advance_any(), T::stamp(), Comma),
        keys,
        T::Guard::can_advance(),
    )
}
