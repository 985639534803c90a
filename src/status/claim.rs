//! Task claiming: workers take up to N rows in one state and move them to
//! another with their owner id and a claim time; each row goes to exactly one worker.
//!
//! Where an `UPDATE` can return the rows it wrote (PostgreSQL, SQLite), a claim is one
//! statement (see `claim_in_one`):
//!
//! ```sql
//! WITH "occ_claimable" AS (SELECT id FROM tasks
//!     WHERE (state = ?open OR (state = ?running AND claimed_at < <database now> - ?reclaim_after))
//!       AND version <> ?max
//!     [ORDER BY id] LIMIT <n> FOR UPDATE SKIP LOCKED)
//! UPDATE tasks SET state = ?running, owner = ?me, claimed_at = <database now>, version = version + 1
//! WHERE (id) IN (SELECT * FROM "occ_claimable") AND version <> ?max RETURNING ...
//! ```
//!
//! MySQL has no `RETURNING`: there a claim is one write transaction of the locked read,
//! the `UPDATE` of the rows it locked, and a read of them as written.
//!
//! `SKIP LOCKED` lets concurrent workers pass over each other's rows instead of waiting:
//! no sleeps, no busy loops. SQLite has no row locks; its writers take turns (the
//! process's write queue, then SQLite's lock). A claim whose owner vanished is taken again
//! once its claim time is older than `reclaim_after`, judged by the database's clock,
//! never a worker's. A row whose version is at its type's maximum cannot be written, so
//! it is never claimed and never holds up the rows behind it. Finishing or releasing a
//! claim is owner-checked: only the worker that holds it can, one row at a time or a
//! whole batch at once ([`GuardedClaim::finish_claims`]). A slow worker keeps its claim
//! with heartbeats ([`GuardedClaim::extend_claim`]); a row that keeps failing is parked
//! after a number of attempts ([`GuardedClaim::claim_counted`]). Each of these runs again
//! after a deadlock or another transient failure (see `claim_retry`).
//!
//! A claim's read skips locked rows and its `UPDATE` writes only rows the read locked, so
//! the claim time is computed after the read's locks are taken, and no bound is needed to
//! keep it true. (On MySQL the `UPDATE` may still wait on, or deadlock over, locks of the
//! state index; the claim then runs again, with a new claim time.)
//!
//! A row the database refuses to write (a trigger that skips it) is not claimed: on
//! MySQL the claim fails with [`Error::Refused`], since it sees that its `UPDATE` wrote
//! fewer rows than its read locked; the one statement of PostgreSQL and SQLite cannot
//! see it, and passes the row over.

use std::time::Duration;

use diesel::connection::LoadConnection;
use diesel::dsl::AsSelect;
use diesel::expression::{AppearsOnTable, Expression, ValidGrouping};
use diesel::query_builder::{AstPass, QueryFragment, QueryId};
use diesel::query_dsl::methods::LoadQuery;
use diesel::serialize::ToSql;
use diesel::sql_types::{Bool, BoolOrNullableBool, HasSqlType, Nullable, Text};
use diesel::{Column, QueryResult, Selectable, SelectableHelper};

use crate::connect::backend::OccBackend;
use crate::connect::transaction::WriteTransaction;
use crate::drive::blocking::complete::Complete;
use crate::drive::blocking::load::LoadByKey;
use crate::drive::{now, Blocking, Io, QueryOn, ReadOn, RunOn, Transactions};
use crate::error::Error;
use crate::flow::claim_lost::{ClaimIgnored, ClaimLost};
use crate::flow::compare_and_set::{CompareAndSet, Matches};
use crate::flow::finish_claims::report::FinishedClaims;
use crate::guard::server_clock::{ClockColumn, ServerClock, Shift};
use crate::guard::status::{HasStatus, Status};
use crate::guard::{AdvanceInSql, Guarded};
use crate::sql::new_token::Counted;
use crate::sql::statement::{And, Assignments, ColumnEq, Comma, GuardedUpdate, Joined};
use crate::status::claim_attempts::{AttemptLimit, ClaimCounted, Claimed};
use crate::status::claim_filter::{ClaimCondition, ClaimFilter, FilterSql};
use crate::status::claim_heartbeat::ExtendClaim;
use crate::status::claim_in_one::{claim_in_one, ClaimInOneOf, ClaimInOneUpdateOf};
use crate::status::claim_retry::retried;
use crate::status::claimable_rows::ClaimableRows;
use crate::status::finish_claims::{EndingOf, FinishClaims};
use crate::telemetry::Call;
use crate::write::bulk::BulkUpdateOf;

use crate::drive::blocking::executor::{classify, Miss};

/// What a worker asks for.
#[derive(Debug, Clone, Copy)]
pub struct ClaimRequest<'a, S> {
    /// The state of rows waiting for a worker.
    pub from: S,
    /// The state of a claimed row.
    pub to: S,
    /// Who claims: a worker id, stored in the owner column. Finishing and heartbeats
    /// are checked by it alone, so make it unique per worker run (a host name plus a
    /// random part), never reused by a restarted worker: a worker that hung past
    /// `reclaim_after` and a later run under the same id could both pass the check.
    pub owner: &'a str,
    /// At most this many rows.
    pub limit: usize,
    /// A claimed row whose claim is older than this (by the database's clock) is taken
    /// again, as abandoned; `None` never takes a claimed row.
    pub reclaim_after: Option<Duration>,
    /// Which of the claimable rows are taken first.
    pub order: ClaimOrder,
}

/// Which claimable rows a claim takes first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ClaimOrder {
    /// Whichever the database finds first: no sort, the cheapest plan with an index on
    /// the status column alone. A row may wait behind rows queued after it.
    #[default]
    Any,
    /// The lowest keys first (`ORDER BY <key>`): first come, first served where keys rise
    /// with time (an auto-increment id, a time-ordered UUID). Give the table an index on
    /// the status column followed by the key columns, `(state, id)`, and a claim without
    /// `reclaim_after` stays a walk of that index that stops after the limit at any queue
    /// length; without one, or with `reclaim_after` (whose `OR` of two states no one index
    /// walk serves in key order), every claim sorts all claimable rows. The rows come back
    /// in no particular order either way. (On MySQL an index on the status column
    /// alone is one, since InnoDB ends each secondary index with the primary key; so it
    /// is on SQLite when the key is the table's `INTEGER PRIMARY KEY`, its rowid.)
    ByKey,
}

/// `(status = ?from OR (status = ?to AND claimed_at < <database now> - ?age)) AND <the
/// token can advance>`: a row whose token is at its end (a version at its type's maximum)
/// cannot be written, so it is never handed out and never holds up the rows behind it.
#[derive(Debug, Clone)]
pub struct Claimable<StatusCol, S, AtCol, CanAdvance> {
    from: S,
    to: S,
    /// The database's now minus the age after which a claim is abandoned.
    abandoned_before: Option<Shift>,
    can_advance: CanAdvance,
    /// The caller's own condition, if any.
    filter: Option<ClaimFilter>,
    columns: std::marker::PhantomData<(StatusCol, AtCol)>,
}

/// The rows of entity `T` a claim may take, by claim-time column `AtCol`.
pub(crate) type ClaimableOf<T, AtCol> = Claimable<
    <T as HasStatus>::StatusColumn,
    <T as HasStatus>::Status,
    AtCol,
    crate::guard::CanAdvanceOf<T>,
>;

impl<StatusCol, S: Copy, AtCol, CanAdvance> Claimable<StatusCol, S, AtCol, CanAdvance> {
    /// The rows `request` may claim, of those whose token `can_advance` and that match
    /// `filter`.
    pub(crate) fn of(
        request: &ClaimRequest<'_, S>,
        filter: Option<&ClaimFilter>,
        can_advance: CanAdvance,
    ) -> Self {
        Claimable {
            from: request.from,
            to: request.to,
            abandoned_before: request.reclaim_after.map(Shift::earlier),
            can_advance,
            filter: filter.cloned(),
            columns: std::marker::PhantomData,
        }
    }
}

impl<StatusCol, S, AtCol, CanAdvance> Expression for Claimable<StatusCol, S, AtCol, CanAdvance> {
    type SqlType = Bool;
}

impl<StatusCol, S, AtCol, CanAdvance, QS> AppearsOnTable<QS>
    for Claimable<StatusCol, S, AtCol, CanAdvance>
{
}

impl<StatusCol, S, AtCol, CanAdvance> ValidGrouping<()>
    for Claimable<StatusCol, S, AtCol, CanAdvance>
{
    type IsAggregate = diesel::expression::is_aggregate::Never;
}

impl<StatusCol, S, AtCol, CanAdvance> QueryId for Claimable<StatusCol, S, AtCol, CanAdvance> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<StatusCol, S, AtCol, CanAdvance, DB> QueryFragment<DB>
    for Claimable<StatusCol, S, AtCol, CanAdvance>
where
    DB: ServerClock + FilterSql + HasSqlType<StatusCol::SqlType>,
    StatusCol: Column,
    AtCol: Column,
    S: ToSql<StatusCol::SqlType, DB>,
    CanAdvance: QueryFragment<DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_sql("((");
        out.push_identifier(StatusCol::NAME)?;
        out.push_sql(" = ");
        out.push_bind_param::<StatusCol::SqlType, S>(&self.from)?;
        if let Some(before) = &self.abandoned_before {
            out.push_sql(" OR (");
            out.push_identifier(StatusCol::NAME)?;
            out.push_sql(" = ");
            out.push_bind_param::<StatusCol::SqlType, S>(&self.to)?;
            out.push_sql(" AND ");
            out.push_identifier(AtCol::NAME)?;
            out.push_sql(" < ");
            DB::push_shifted::<chrono::NaiveDateTime>(&mut out, before)?;
            out.push_sql(")");
        }
        out.push_sql(")");
        if !self.can_advance.is_noop(out.backend())? {
            out.push_sql(" AND ");
            self.can_advance.walk_ast(out.reborrow())?;
        }
        if let Some(filter) = &self.filter {
            out.push_sql(" AND (");
            DB::claim_filter(filter).walk_ast(out.reborrow())?;
            out.push_sql(")");
        }
        out.push_sql(")");
        Ok(())
    }
}

/// The claimable rows of entity `T`, at most a limit, locked and skipping locked ones.
pub(crate) type ClaimQueryOf<T, AtCol, DB> = ClaimableRows<
    <T as diesel::associations::HasTable>::Table,
    AsSelect<T, DB>,
    ClaimableOf<T, AtCol>,
>;

/// `status = ?to, owner = ?, claimed_at = <database now>`: a row handed to its owner.
pub(crate) type ClaimChanges<T, OwnerCol, AtCol> = Joined<
    Joined<
        ColumnEq<<T as HasStatus>::StatusColumn, <T as HasStatus>::Status>,
        ColumnEq<OwnerCol, Option<String>>,
        Comma,
    >,
    ClockColumn<AtCol>,
    Comma,
>;

/// The `UPDATE` that hands the selected rows of `T` to their new owner, advancing each
/// one's token.
pub(crate) type ClaimUpdateOf<T, OwnerCol, AtCol> =
    BulkUpdateOf<T, ClaimChanges<T, OwnerCol, AtCol>, <T as Guarded>::KeysPredicate>;

/// `status = ?held AND owner = ?me`: the claim is still this owner's.
pub(crate) type HeldBy<T, OwnerCol> = Joined<
    ColumnEq<<T as HasStatus>::StatusColumn, <T as HasStatus>::Status>,
    ColumnEq<OwnerCol, String>,
    And,
>;

/// `UPDATE ... SET status = ?to, owner = ?, <token advanced> WHERE key AND status = ?held
/// AND owner = ?me`: the owner-checked end of a claim.
pub(crate) type FinishOf<T, OwnerCol> = FinishWhere<T, OwnerCol, <T as Guarded>::KeyPredicate>;

/// Task claiming for entities with a status column, an owner column (`Nullable<Text>`)
/// and a claim-time column (`Nullable<Timestamp>`), whose guard advances in SQL (a
/// version, a timestamp, `xmin`).
pub trait GuardedClaim: HasStatus + Clone
where
    Self::Guard: AdvanceInSql,
{
    /// Claims up to `request.limit` rows in state `from` (and abandoned claims, with
    /// `reclaim_after`), moving them to `to` with `request.owner` in `owner` and the
    /// database's now in `claimed_at`: one statement on PostgreSQL and SQLite, one write
    /// transaction on MySQL. Returns the claimed rows as written; none when nothing is
    /// waiting. Each row goes to one worker. Run again after a deadlock, outside the
    /// caller's transaction.
    fn claim<C, OwnerCol, AtCol>(
        conn: &mut C,
        owner: OwnerCol,
        claimed_at: AtCol,
        request: &ClaimRequest<'_, Self::Status>,
    ) -> Result<Vec<Self>, Error>
    where
        Self: ClaimRows<C, OwnerCol, AtCol>,
        C: diesel::Connection,
    {
        let _ = (owner, claimed_at);
        retried(conn, |conn| Self::claim_rows(conn, request, None))
    }

    /// [`claim`](Self::claim) of the waiting rows that also match `condition`, a boolean
    /// diesel expression on the entity's table (`tasks::tenant.eq("acme")`,
    /// `tasks::kind.eq_any(["email", "sms"])`): a worker for one tenant or one kind of job.
    /// It is added to the claim's read as `AND (<condition>)`, so it takes part in the
    /// plan; an index on the status column and the condition's columns keeps the read a
    /// walk that stops after the limit. Abandoned claims are taken again only when they
    /// match it too.
    fn claim_where<C, OwnerCol, AtCol, G>(
        conn: &mut C,
        owner: OwnerCol,
        claimed_at: AtCol,
        request: &ClaimRequest<'_, Self::Status>,
        condition: G,
    ) -> Result<Vec<Self>, Error>
    where
        Self: ClaimRows<C, OwnerCol, AtCol>,
        C: diesel::Connection,
        G: ClaimCondition + AppearsOnTable<Self::Table> + Expression,
        G::SqlType: BoolOrNullableBool,
    {
        let _ = (owner, claimed_at);
        let filter = ClaimFilter::of(condition);
        retried(conn, |conn| Self::claim_rows(conn, request, Some(&filter)))
    }

    /// [`claim`](Self::claim), counting attempts in the `Integer` column `attempts`: each
    /// claimed row's count goes up by one, and a claimable row whose count reached
    /// `limit.max` is moved to `limit.park_in` (owner cleared) instead of being claimed,
    /// so a row that kills every worker that takes it stops coming back. Parked rows count
    /// toward `request.limit` and are returned apart ([`Claimed::parked`]).
    fn claim_counted<C, OwnerCol, AtCol, AttemptsCol>(
        conn: &mut C,
        owner: OwnerCol,
        claimed_at: AtCol,
        attempts: AttemptsCol,
        request: &ClaimRequest<'_, Self::Status>,
        limit: &AttemptLimit<Self::Status>,
    ) -> Result<Claimed<Self>, Error>
    where
        Self: ClaimCounted<C, OwnerCol, AtCol, AttemptsCol>,
        C: diesel::Connection,
    {
        let _ = (owner, claimed_at, attempts);
        retried(conn, |conn| {
            Self::claim_counted_rows(conn, request, limit, None)
        })
    }

    /// [`claim_counted`](Self::claim_counted) of the waiting rows that also match
    /// `condition`, as [`claim_where`](Self::claim_where) filters a claim; rows parked
    /// are among those that match it.
    #[allow(clippy::too_many_arguments)] // The columns are named as the other claims name them.
    fn claim_counted_where<C, OwnerCol, AtCol, AttemptsCol, G>(
        conn: &mut C,
        owner: OwnerCol,
        claimed_at: AtCol,
        attempts: AttemptsCol,
        request: &ClaimRequest<'_, Self::Status>,
        limit: &AttemptLimit<Self::Status>,
        condition: G,
    ) -> Result<Claimed<Self>, Error>
    where
        Self: ClaimCounted<C, OwnerCol, AtCol, AttemptsCol>,
        C: diesel::Connection,
        G: ClaimCondition + AppearsOnTable<Self::Table> + Expression,
        G::SqlType: BoolOrNullableBool,
    {
        let _ = (owner, claimed_at, attempts);
        let filter = ClaimFilter::of(condition);
        retried(conn, |conn| {
            Self::claim_counted_rows(conn, request, limit, Some(&filter))
        })
    }

    /// The heartbeat of a claim `owner` still holds on the row with `key` (in state
    /// `held`): its claim time becomes the database's now, so a worker that is slow but
    /// alive is not taken over as abandoned. Call it well within `reclaim_after`. The row
    /// as written (its token advanced, so copies read before it are stale: use the row
    /// returned); [`Error::LockLost`] when another worker took the claim over or it left
    /// `held`, [`Error::NotFound`] when the row is gone.
    fn extend_claim<C, OwnerCol, AtCol>(
        conn: &mut C,
        key: &Self::Key,
        owner_column: OwnerCol,
        claimed_at: AtCol,
        owner: &str,
        held: Self::Status,
    ) -> Result<Self, Error>
    where
        Self: ExtendClaim<C, OwnerCol, AtCol>,
        C: diesel::Connection,
    {
        let _ = (owner_column, claimed_at);
        retried(conn, |conn| Self::extend_claim_row(conn, key, owner, held))
    }

    /// Ends the claim `owner` holds on the row with `key`: from state `held` to `to`, the
    /// owner column set to `next_owner` (`None` to clear it), the version advanced. Only
    /// the holder can: a row another worker took over (or already finished) is
    /// [`Error::LockLost`]; a missing row [`Error::NotFound`].
    fn finish_claim<C, OwnerCol>(
        conn: &mut C,
        key: &Self::Key,
        owner_column: OwnerCol,
        owner: &str,
        held: Self::Status,
        to: Self::Status,
        next_owner: Option<&str>,
    ) -> Result<(), Error>
    where
        Self: FinishClaim<C, OwnerCol>,
        C: diesel::Connection,
    {
        let _ = owner_column;
        retried(conn, |conn| {
            Self::finish_claim_row(conn, key, owner, held, to, next_owner)
        })
    }

    /// [`finish_claim`](Self::finish_claim) for the rows of many `keys` at once: one
    /// statement per 500 keys on PostgreSQL and SQLite, one transaction per 500 keys
    /// on MySQL. Each claim still this worker's ends; the others are answered one by one
    /// in [`FinishedClaims::lost`] (nothing about them is written). An error that is not
    /// about a row (a lost connection, say) ends the call; the statements sent before it
    /// stay done.
    fn finish_claims<C, OwnerCol>(
        conn: &mut C,
        keys: &[Self::Key],
        owner_column: OwnerCol,
        owner: &str,
        held: Self::Status,
        to: Self::Status,
        next_owner: Option<&str>,
    ) -> Result<FinishedClaims<Self::Key>, Error>
    where
        Self: FinishClaims<C, OwnerCol>,
    {
        let _ = owner_column;
        Self::finish_claims_rows(conn, keys, owner, held, to, next_owner)
    }
}

impl<T, C> Miss<C> for ClaimIgnored<'_, T>
where
    T: LoadByKey<C>,
    T::Guard: AdvanceInSql,
    C: LoadConnection,
    C::Backend: OccBackend,
{
    fn explain(self, conn: &mut C) -> Error {
        let keys: Vec<T::Key> = self.locked.iter().map(Guarded::key).collect();
        match T::load_by_keys(conn, &keys) {
            Ok(current) => self.given(current),
            Err(e) => classify(conn, e),
        }
    }
}

impl<T, C> Miss<C> for ClaimLost<'_, T>
where
    T: HasStatus + LoadByKey<C>,
    T::Guard: AdvanceInSql,
    C: LoadConnection,
    C::Backend: OccBackend,
{
    fn explain(self, conn: &mut C) -> Error {
        match T::load_by_key(conn, self.key) {
            Ok(row) => self.given(T::table_name(), row),
            Err(e) => classify(conn, e),
        }
    }
}

impl<T> GuardedClaim for T
where
    T: HasStatus + Clone,
    T::Guard: AdvanceInSql,
{
}

/// A claim of rows of entity `Self` with owner column `OwnerCol` and claim-time column
/// `AtCol` on connection `C`, as one bound; like [`UpdateRow`](crate::UpdateRow), not a
/// trait to implement.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot claim rows with `{OwnerCol}` and `{AtCol}` on `{C}`",
    note = "the owner column must be `Nullable<Text>` and the claim time a timestamp column of the entity's table, the entity `Selectable`, the connection a diesel connection of a backend diesel-occ supports, and the guard must advance in SQL",
    note = "on a diesel-async connection, call the async API instead: `use diesel_occ::asynchronous::prelude::*`, not `diesel_occ::prelude::*`"
)]
pub trait ClaimRows<C, OwnerCol, AtCol>: HasStatus + Clone + LoadByKey<C> {
    /// Runs the claim; [`GuardedClaim`] calls it.
    #[doc(hidden)]
    fn claim_rows(
        conn: &mut C,
        request: &ClaimRequest<'_, Self::Status>,
        filter: Option<&ClaimFilter>,
    ) -> Result<Vec<Self>, Error>;
}

// Errors name this trait and its hints, not the first bound of the impl that fails.
#[diagnostic::do_not_recommend]
impl<T, C, OwnerCol, AtCol> ClaimRows<C, OwnerCol, AtCol> for T
where
    T: HasStatus + Clone,
    T::Guard: AdvanceInSql,
    C: LoadConnection + WriteTransaction + Send,
    C::Backend: OccBackend,
    OwnerCol: Column<Table = T::Table, SqlType = Nullable<Text>>,
    AtCol: Column<Table = T::Table>,
    T: LoadByKey<C> + Selectable<C::Backend>,
    T::SelectExpression: QueryId,
    ClaimQueryOf<T, AtCol, C::Backend>: LoadQuery<'static, C, Self> + Send,
    ClaimUpdateOf<T, OwnerCol, AtCol>: Assignments<C::Backend>,
    Counted: Complete<C, ClaimUpdateOf<T, OwnerCol, AtCol>, ()>,
    ClaimInOneOf<T, OwnerCol, AtCol, C::Backend>: LoadQuery<'static, C, T> + Send,
    ClaimInOneUpdateOf<T, OwnerCol, AtCol>: Assignments<C::Backend>,
    OwnerCol: Default,
    T::Table: diesel::query_dsl::methods::FilterDsl<T::KeysPredicate>,
    diesel::dsl::Filter<T::Table, T::KeysPredicate>:
        diesel::query_dsl::methods::SelectDsl<OwnerCol>,
    OwnersOf<T, OwnerCol>: LoadQuery<'static, C, Option<String>> + Send,
{
    fn claim_rows(
        conn: &mut C,
        request: &ClaimRequest<'_, T::Status>,
        filter: Option<&ClaimFilter>,
    ) -> Result<Vec<T>, Error> {
        now(claim::<T, _, OwnerCol, AtCol>(
            Blocking::wrap(conn),
            request,
            filter,
        ))
    }
}

/// The claim, on either driver: one statement that claims and returns the rows where the
/// backend has `RETURNING`; elsewhere a write transaction that reads the claimable rows
/// (locked, skipping other workers' rows) and hands them over.
pub(crate) async fn claim<T, C, OwnerCol, AtCol>(
    conn: &mut C,
    request: &ClaimRequest<'_, T::Status>,
    filter: Option<&ClaimFilter>,
) -> Result<Vec<T>, Error>
where
    C: Transactions,
    T: HasStatus + Clone + ReadOn<C> + Selectable<C::Backend>,
    T::Guard: AdvanceInSql,
    OwnerCol: Column<Table = T::Table, SqlType = Nullable<Text>>,
    AtCol: Column<Table = T::Table>,
    ClaimQueryOf<T, AtCol, C::Backend>: QueryOn<C, T> + Send,
    for<'k> Counted: RunOn<C, ClaimUpdateOf<T, OwnerCol, AtCol>, ClaimIgnored<'k, T>, ()>,
    ClaimInOneOf<T, OwnerCol, AtCol, C::Backend>: QueryOn<C, T> + Send,
    ClaimInOneUpdateOf<T, OwnerCol, AtCol>: Assignments<C::Backend>,
    OwnerCol: Default,
    T::Table: diesel::query_dsl::methods::FilterDsl<T::KeysPredicate>,
    diesel::dsl::Filter<T::Table, T::KeysPredicate>:
        diesel::query_dsl::methods::SelectDsl<OwnerCol>,
    OwnersOf<T, OwnerCol>: QueryOn<C, Option<String>> + Send,
{
    let call = Call::new::<C::Backend>("claim", T::table_name(), None);
    call.run_reporting(
        async move {
            crate::sql::names::check_name("owner", request.owner)?;
            if request.limit == 0 {
                return Ok(Vec::new());
            }
            conn.refuse_broken()?;
            if C::Backend::RETURNING {
                T::check_stored_precision(conn).await?;
                let claim = claim_in_one::<T, OwnerCol, AtCol, C::Backend>(
                    T::table_name(),
                    request,
                    filter,
                )?;
                return conn
                    .protect_caller(false, async |conn: &mut C| claim.load_on(conn).await)
                    .await;
            }
            conn.own_transaction(async |conn: &mut C| {
                let query = claim_query::<T, AtCol, C::Backend>(request, filter);
                let waiting: Vec<T> = match query.load_on(conn).await {
                    Ok(rows) => rows,
                    Err(e) => return Err(conn.classify(e).await),
                };
                let rows = write_locked(conn, &waiting, request.to, |keys| {
                    claim_update::<T, OwnerCol, AtCol, _>(request, keys)
                })
                .await?;
                check_claimed_by::<T, C, OwnerCol>(conn, &rows, request.owner).await?;
                Ok(rows)
            })
            .await
        },
        |answer| {
            if let Ok(rows) = answer {
                crate::telemetry::claimed(T::table_name(), request.owner, rows.len());
            }
        },
    )
    .await
}

/// The read of up to `request.limit` rows `request` may claim, locked, skipping rows other
/// workers hold.
pub(crate) fn claim_query<T, AtCol, DB>(
    request: &ClaimRequest<'_, T::Status>,
    filter: Option<&ClaimFilter>,
) -> ClaimQueryOf<T, AtCol, DB>
where
    T::Guard: AdvanceInSql,
    T: HasStatus + Selectable<DB>,
    DB: diesel::backend::Backend,
{
    let filter = Claimable::of(request, filter, T::Guard::can_advance());
    ClaimableRows::new(
        T::table(),
        T::as_select(),
        filter,
        request.order,
        request.limit,
    )
}

/// The `UPDATE` handing the rows `keys` selects to `request.owner`, advancing each token.
pub(crate) fn claim_update<T, OwnerCol, AtCol, Keys>(
    request: &ClaimRequest<'_, T::Status>,
    keys: Keys,
) -> BulkUpdateOf<T, ClaimChanges<T, OwnerCol, AtCol>, Keys>
where
    T: HasStatus,
    T::Guard: AdvanceInSql,
{
    BulkUpdateOf::<T, ClaimChanges<T, OwnerCol, AtCol>, Keys>::new(
        T::table(),
        claim_changes::<T, OwnerCol, AtCol>(request),
        Joined(T::Guard::advance_any(), T::stamp(), Comma),
        keys,
        T::Guard::can_advance(),
    )
}

/// `status = ?to, owner = ?me, claimed_at = <database now>`.
pub(crate) fn claim_changes<T: HasStatus, OwnerCol, AtCol>(
    request: &ClaimRequest<'_, T::Status>,
) -> ClaimChanges<T, OwnerCol, AtCol> {
    Joined(
        Joined(
            ColumnEq::new(request.to),
            ColumnEq::new(Some(request.owner.to_string())),
            Comma,
        ),
        ClockColumn::set(Shift::none()),
        Comma,
    )
}

/// Refuses an owner (and a next owner) the owner column cannot hold or compare: empty,
/// with a NUL, or longer than the name limit.
pub(crate) fn check_owners(owner: &str, next_owner: Option<&str>) -> Result<(), Error> {
    crate::sql::names::check_name("owner", owner)?;
    next_owner.map_or(Ok(()), |next| {
        crate::sql::names::check_name("next owner", next)
    })
}

/// `status = ?to, owner = ?next`: what the end of a claim writes.
pub(crate) type FinishChanges<T, OwnerCol> = Joined<
    ColumnEq<<T as HasStatus>::StatusColumn, <T as HasStatus>::Status>,
    ColumnEq<OwnerCol, Option<String>>,
    Comma,
>;

/// The owner-checked end of `owner`'s claims on the rows `keys` selects.
pub(crate) type FinishWhere<T, OwnerCol, Keys> = GuardedUpdate<
    <T as diesel::associations::HasTable>::Table,
    FinishChanges<T, OwnerCol>,
    crate::guard::AdvanceAnyOf<T>,
    Keys,
    Joined<HeldBy<T, OwnerCol>, crate::guard::CanAdvanceOf<T>, And>,
>;

/// The owner-checked end of `owner`'s claims on the rows `keys` selects: from `held` to
/// `to`, the owner set to `next_owner`.
pub(crate) fn finish_where<T, OwnerCol, Keys>(
    keys: Keys,
    owner: &str,
    held: T::Status,
    to: T::Status,
    next_owner: Option<&str>,
) -> FinishWhere<T, OwnerCol, Keys>
where
    T: HasStatus,
    T::Guard: AdvanceInSql,
{
    FinishWhere::<T, OwnerCol, Keys>::new(
        T::table(),
        Joined(
            ColumnEq::new(to),
            ColumnEq::new(next_owner.map(str::to_string)),
            Comma,
        ),
        Joined(T::Guard::advance_any(), T::stamp(), Comma),
        keys,
        held_by::<T, OwnerCol>(owner, held),
    )
}

/// The owner-checked end of `owner`'s claim on the row with `key`.
pub(crate) fn finish_statement<T, OwnerCol>(
    key: &T::Key,
    owner: &str,
    held: T::Status,
    to: T::Status,
    next_owner: Option<&str>,
) -> FinishOf<T, OwnerCol>
where
    T: HasStatus,
    T::Guard: AdvanceInSql,
{
    finish_where::<T, OwnerCol, _>(T::key_predicate(key), owner, held, to, next_owner)
}

/// `status = ?held AND owner = ?me AND <the token can advance>`.
pub(crate) fn held_by<T, OwnerCol>(
    owner: &str,
    held: T::Status,
) -> Joined<HeldBy<T, OwnerCol>, crate::guard::CanAdvanceOf<T>, And>
where
    T: HasStatus,
    T::Guard: AdvanceInSql,
{
    Joined(
        Joined(ColumnEq::new(held), ColumnEq::new(owner.to_string()), And),
        T::Guard::can_advance(),
        And,
    )
}

/// Runs the `UPDATE` that `update` builds for the keys of the `locked` rows, inside the
/// claim's transaction, and reads them back as written (each in status `written`), on
/// either driver.
///
/// A row read back in another status means the transaction was rolled back under the
/// claim without a statement failing: a MariaDB Galera node aborted it for another
/// node's write (a cancel, say) and the read saw that write instead. The claim then
/// fails retryable and is run again, rather than hand over a row it does not hold.
pub(crate) async fn write_locked<T, C, U>(
    conn: &mut C,
    locked: &[T],
    written: T::Status,
    update: impl FnOnce(T::KeysPredicate) -> U + Send,
) -> Result<Vec<T>, Error>
where
    C: Io,
    T: HasStatus + ReadOn<C>,
    T::Guard: AdvanceInSql,
    for<'k> Counted: RunOn<C, U, ClaimIgnored<'k, T>, ()>,
{
    if locked.is_empty() {
        return Ok(Vec::new());
    }
    T::check_stored_precision(conn).await?;
    let keys: Vec<T::Key> = locked.iter().map(Guarded::key).collect();
    let write = claim_write(locked, &keys, T::table_name(), update);
    <Counted as RunOn<C, _, _, ()>>::run(conn, write, true).await?;
    let rows = match T::load_by_keys(conn, &keys).await {
        Ok(rows) => rows,
        Err(e) => return Err(conn.classify(e).await),
    };
    as_written(rows, keys.len(), written, T::table_name())
}

/// `rows`, read back inside the claim's transaction, when there are `expected` of them
/// and each is in status `written`; otherwise the claim's write is gone (see
/// [`write_locked`]): a retryable failure.
fn as_written<T: HasStatus>(
    rows: Vec<T>,
    expected: usize,
    written: T::Status,
    table: &'static str,
) -> Result<Vec<T>, Error> {
    let lost = rows.iter().find(|row| row.status() != written);
    if rows.len() == expected && lost.is_none() {
        return Ok(rows);
    }
    let why = match lost {
        Some(row) => format!(
            "a row read back {}, not {}",
            row.status().name(),
            written.name()
        ),
        None => format!("{} of {expected} rows read back", rows.len()),
    };
    Err(claim_rolled_back(table, why))
}

/// The retryable failure of a claim whose write was gone inside its own transaction
/// (`why`, as read back): the server had rolled it back.
fn claim_rolled_back(table: &'static str, why: String) -> Error {
    Error::Retryable {
        reason: crate::RetryReason::SerializationFailure,
        source: diesel::result::Error::DatabaseError(
            diesel::result::DatabaseErrorKind::SerializationFailure,
            Box::new(format!(
                "the claim's write of {table} was gone inside its own transaction ({why}): \
                 the server had rolled it back"
            )),
        ),
    }
}

/// The owners of rows of `T` by key: what a claim's rows hold in `OwnerCol`.
pub(crate) type OwnersOf<T, OwnerCol> = diesel::dsl::Select<
    diesel::dsl::Filter<
        <T as diesel::associations::HasTable>::Table,
        <T as Guarded>::KeysPredicate,
    >,
    OwnerCol,
>;

/// Inside the claim's transaction, after its rows were read back in the claimed state:
/// each must hold `owner`. A Galera node can roll the transaction back under the claim
/// without a statement failing, and the read then shows another worker's claim of the
/// same rows (same state, same token): only the owner tells it. A retryable failure
/// when a row does not, as [`as_written`].
pub(crate) async fn check_claimed_by<T, C, OwnerCol>(
    conn: &mut C,
    rows: &[T],
    owner: &str,
) -> Result<(), Error>
where
    C: Io,
    T: ReadOn<C>,
    OwnerCol: Column<Table = T::Table> + Default,
    T::Table: diesel::query_dsl::methods::FilterDsl<T::KeysPredicate>,
    diesel::dsl::Filter<T::Table, T::KeysPredicate>:
        diesel::query_dsl::methods::SelectDsl<OwnerCol>,
    OwnersOf<T, OwnerCol>: QueryOn<C, Option<String>> + Send,
{
    use diesel::query_dsl::methods::{FilterDsl, SelectDsl};
    if rows.is_empty() {
        return Ok(());
    }
    let keys: Vec<T::Key> = rows.iter().map(Guarded::key).collect();
    let query = T::table()
        .filter(T::keys_predicate(&keys))
        .select(OwnerCol::default());
    let owners = match query.load_on(conn).await {
        Ok(owners) => owners,
        Err(e) => return Err(conn.classify(e).await),
    };
    if owners.len() == keys.len() && owners.iter().all(|o| o.as_deref() == Some(owner)) {
        return Ok(());
    }
    Err(claim_rolled_back(
        T::table_name(),
        format!("owners read back {owners:?}, not {owner:?}"),
    ))
}

/// The write of the `UPDATE` that `update` builds for the `locked` rows (with `keys`, in
/// `table`): it must match every one, since the claim's read locked them. `keys` is a
/// `Vec` because the write names its keys as one `Debug` value, which a slice is not.
#[allow(clippy::ptr_arg)]
pub(crate) fn claim_write<'k, T, U>(
    locked: &'k [T],
    keys: &'k Vec<T::Key>,
    table: &'static str,
    update: impl FnOnce(T::KeysPredicate) -> U,
) -> CompareAndSet<'k, U, ClaimIgnored<'k, T>>
where
    T: Guarded,
{
    let update = update(T::keys_predicate(keys));
    CompareAndSet::one(update, table, keys, ClaimIgnored { locked, table })
        .matching(Matches::All(keys.len()))
}

/// The end of a claim of a row of entity `Self` with owner column `OwnerCol` on
/// connection `C`, as one bound; like [`UpdateRow`](crate::UpdateRow), not a trait to
/// implement.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot finish a claim with `{OwnerCol}` on `{C}`",
    note = "the owner column must be a `Nullable<Text>` column of the entity's table, the connection a diesel connection of a backend diesel-occ supports, and the guard must advance in SQL",
    note = "on a diesel-async connection, call the async API instead: `use diesel_occ::asynchronous::prelude::*`, not `diesel_occ::prelude::*`"
)]
pub trait FinishClaim<C, OwnerCol>: HasStatus + LoadByKey<C> {
    /// Runs the end of the claim; [`GuardedClaim`] calls it.
    #[doc(hidden)]
    fn finish_claim_row(
        conn: &mut C,
        key: &Self::Key,
        owner: &str,
        held: Self::Status,
        to: Self::Status,
        next_owner: Option<&str>,
    ) -> Result<(), Error>;
}

// Errors name this trait and its hints, not the first bound of the impl that fails.
#[diagnostic::do_not_recommend]
impl<T, C, OwnerCol> FinishClaim<C, OwnerCol> for T
where
    T: HasStatus,
    T::Guard: AdvanceInSql,
    C: LoadConnection + Send,
    C::Backend: OccBackend,
    OwnerCol: Column<Table = T::Table, SqlType = Nullable<Text>>,
    T: LoadByKey<C>,
    FinishOf<T, OwnerCol>: Assignments<C::Backend>,
    Counted: Complete<C, FinishOf<T, OwnerCol>, ()>,
{
    fn finish_claim_row(
        conn: &mut C,
        key: &T::Key,
        owner: &str,
        held: T::Status,
        to: T::Status,
        next_owner: Option<&str>,
    ) -> Result<(), Error> {
        let ending = (owner, held, to, next_owner);
        now(end_claim::<T, _, OwnerCol>(
            Blocking::wrap(conn),
            key,
            ending,
        ))
    }
}

/// The owner-checked end of the claim on the row with `key`, on either driver: one
/// statement, a call that is not dropped half way.
pub(crate) async fn end_claim<T, C, OwnerCol>(
    conn: &mut C,
    key: &T::Key,
    (owner, held, to, next_owner): EndingOf<'_, T>,
) -> Result<(), Error>
where
    C: Io,
    T: HasStatus + ReadOn<C>,
    T::Guard: AdvanceInSql,
    OwnerCol: Column<Table = T::Table, SqlType = Nullable<Text>>,
    for<'k> Counted: RunOn<C, FinishOf<T, OwnerCol>, ClaimLost<'k, T>, ()>,
{
    let call = Call::new::<C::Backend>("finish_claim", T::table_name(), Some(key));
    let answer = call
        .run(async move {
            check_owners(owner, next_owner)?;
            conn.refuse_broken()?;
            let table = T::table_name();
            conn.call(async |conn: &mut C| {
                T::check_stored_precision(conn).await?;
                let statement = finish_statement::<T, OwnerCol>(key, owner, held, to, next_owner);
                let miss = ClaimLost::<T> { key, owner, held };
                let write = CompareAndSet::one(statement, table, key, miss);
                <Counted as RunOn<C, _, _, ()>>::run(conn, write, false)
                    .await
                    .map(drop)
            })
            .await
        })
        .await;
    answer
}

#[cfg(test)]
mod tests {
    use super::as_written;
    use crate::error::{Error, RetryReason};

    diesel::table! {
        orders (id) {
            id -> BigInt,
            state -> Text,
            version -> BigInt,
        }
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq, crate::Status)]
    enum Stage {
        Placed,
        #[occ(from(Placed))]
        Packing,
        #[occ(from(Placed, Packing))]
        Cancelled,
    }

    #[derive(Debug, Clone, PartialEq, diesel::Queryable, diesel::Identifiable, crate::Guarded)]
    #[diesel(table_name = orders)]
    struct Order {
        id: i64,
        #[occ(status)]
        state: Stage,
        #[occ(version)]
        version: i64,
    }

    fn order(id: i64, state: Stage) -> Order {
        Order {
            id,
            state,
            version: 2,
        }
    }

    fn lost(answer: Result<Vec<Order>, Error>) -> bool {
        matches!(
            answer,
            Err(Error::Retryable {
                reason: RetryReason::SerializationFailure,
                ..
            })
        )
    }

    #[test]
    fn rows_read_back_as_written_are_the_claim() {
        let rows = vec![order(1, Stage::Packing), order(2, Stage::Packing)];
        let claimed = as_written(rows.clone(), 2, Stage::Packing, "orders").unwrap();
        assert_eq!(claimed, rows);
    }

    #[test]
    fn a_row_read_back_in_another_state_or_missing_is_a_claim_rolled_back() {
        // Cancelled by another node's write that aborted the claim's transaction.
        let cancelled = vec![order(1, Stage::Packing), order(2, Stage::Cancelled)];
        assert!(lost(as_written(cancelled, 2, Stage::Packing, "orders")));
        let missing = vec![order(1, Stage::Packing)];
        assert!(lost(as_written(missing, 2, Stage::Packing, "orders")));
    }
}
