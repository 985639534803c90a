//! Task claiming: workers take up to N rows in one state and move them to
//! another with their owner id and a claim time; each row goes to exactly one worker.
//!
//! One write transaction per claim:
//!
//! ```sql
//! SELECT ... FROM tasks
//! WHERE state = ?open OR (state = ?running AND claimed_at < <database now> - ?reclaim_after)
//! LIMIT ? FOR UPDATE SKIP LOCKED          -- PostgreSQL, MySQL 8, MariaDB 10.6+
//! UPDATE tasks SET state = ?running, owner = ?me, claimed_at = <database now>,
//!                  version = version + 1
//! WHERE (<key 1>) OR (<key 2>) ...
//! ```
//!
//! `SKIP LOCKED` lets concurrent workers pass over each other's rows instead of waiting:
//! no sleeps, no busy loops. SQLite has no row locks; its immediate write transaction
//! makes claims take turns. A claim whose owner vanished is taken again once its claim time
//! is older than `reclaim_after`, judged by the database's clock, never a worker's.
//! Finishing or releasing a claim is owner-checked: only the worker that holds it can.

use std::time::Duration;

use diesel::connection::LoadConnection;
use diesel::dsl::{AsSelect, Filter, Limit, Select};
use diesel::expression::{AppearsOnTable, Expression, ValidGrouping};
use diesel::query_builder::{AstPass, QueryFragment, QueryId};
use diesel::query_dsl::methods::{ExecuteDsl, FilterDsl, LimitDsl, LoadQuery, SelectDsl};
use diesel::serialize::ToSql;
use diesel::sql_types::{Bool, HasSqlType, Nullable, Text};
use diesel::{Column, QueryResult, RunQueryDsl, Selectable, SelectableHelper};

use crate::backend::OccBackend;
use crate::bulk::Increment;
use crate::connection::{commit_operation, WriteTransaction};
use crate::database_clock::{ServerClock, Shift};
use crate::error::Error;
use crate::guard::Guarded;
use crate::statement::{AnyOf, ColumnEq, Comma, CompareAndSet, GuardedUpdate, Joined, Unguarded};
use crate::status::{HasStatus, Status};
use crate::update::{classify, LoadByKey};
use crate::version::{VersionColumnFor, VersionGuard, VersionNumber};

/// What a worker asks for.
#[derive(Debug, Clone, Copy)]
pub struct ClaimRequest<'a, S> {
    /// The state of rows waiting for a worker.
    pub from: S,
    /// The state of a claimed row.
    pub to: S,
    /// Who claims: a worker id, stored in the owner column.
    pub owner: &'a str,
    /// At most this many rows.
    pub limit: usize,
    /// A claimed row whose claim is older than this (by the database's clock) is taken
    /// again, as abandoned; `None` never takes a claimed row.
    pub reclaim_after: Option<Duration>,
}

/// `status = ?from OR (status = ?to AND claimed_at < <database now> - ?age)`.
#[derive(Debug, Clone)]
pub struct Claimable<StatusCol, S, AtCol> {
    from: S,
    to: S,
    /// The database's now minus the age after which a claim is abandoned.
    abandoned_before: Option<Shift>,
    columns: std::marker::PhantomData<(StatusCol, AtCol)>,
}

impl<StatusCol, S, AtCol> Expression for Claimable<StatusCol, S, AtCol> {
    type SqlType = Bool;
}

impl<StatusCol, S, AtCol, QS> AppearsOnTable<QS> for Claimable<StatusCol, S, AtCol> {}

impl<StatusCol, S, AtCol> ValidGrouping<()> for Claimable<StatusCol, S, AtCol> {
    type IsAggregate = diesel::expression::is_aggregate::Never;
}

impl<StatusCol, S, AtCol> QueryId for Claimable<StatusCol, S, AtCol> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<StatusCol, S, AtCol, DB> QueryFragment<DB> for Claimable<StatusCol, S, AtCol>
where
    DB: ServerClock + HasSqlType<StatusCol::SqlType>,
    StatusCol: Column,
    AtCol: Column,
    S: ToSql<StatusCol::SqlType, DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_sql("(");
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
            DB::push_shifted(&mut out, before)?;
            out.push_sql(")");
        }
        out.push_sql(")");
        Ok(())
    }
}

/// `"claimed_at" = <the database's now>`, in the form the reclaim check compares.
#[derive(Debug, Clone)]
pub struct StampNow<AtCol>(Shift, std::marker::PhantomData<AtCol>);

impl<AtCol> Default for StampNow<AtCol> {
    fn default() -> Self {
        StampNow(Shift::none(), std::marker::PhantomData)
    }
}

impl<AtCol: Column, DB: ServerClock> QueryFragment<DB> for StampNow<AtCol> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_identifier(AtCol::NAME)?;
        out.push_sql(" = ");
        DB::push_shifted(&mut out, &self.0)
    }
}

/// A query read as the rows no other transaction holds, locking them
/// ([`OccBackend::SKIP_LOCKED`]).
#[derive(Debug, Clone)]
pub struct SkipLocked<Q>(Q);

impl<Q: diesel::query_builder::Query> diesel::query_builder::Query for SkipLocked<Q> {
    type SqlType = Q::SqlType;
}

impl<Q: QueryFragment<DB>, DB: OccBackend> QueryFragment<DB> for SkipLocked<Q> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        self.0.walk_ast(out.reborrow())?;
        out.push_sql(DB::SKIP_LOCKED);
        Ok(())
    }
}

impl<Q> QueryId for SkipLocked<Q> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<Q, Conn> RunQueryDsl<Conn> for SkipLocked<Q> {}

/// The claimable rows of entity `T`, at most a limit, locked and skipping locked ones.
pub type ClaimQueryOf<T, AtCol, DB> = SkipLocked<
    Limit<
        Select<
            Filter<
                <T as diesel::associations::HasTable>::Table,
                Claimable<<T as HasStatus>::StatusColumn, <T as HasStatus>::Status, AtCol>,
            >,
            AsSelect<T, DB>,
        >,
    >,
>;

/// The `UPDATE` that hands the selected rows of `T` to their new owner.
pub type ClaimUpdateOf<T, OwnerCol, AtCol, VCol> = GuardedUpdate<
    <T as diesel::associations::HasTable>::Table,
    Joined<
        Joined<
            ColumnEq<<T as HasStatus>::StatusColumn, <T as HasStatus>::Status>,
            ColumnEq<OwnerCol, Option<String>>,
            Comma,
        >,
        StampNow<AtCol>,
        Comma,
    >,
    Increment<VCol>,
    AnyOf<<T as Guarded>::KeyPredicate>,
    Unguarded,
>;

/// `UPDATE ... SET status = ?to, owner = ?, version = version + 1 WHERE key AND status =
/// ?held AND owner = ?me`: the owner-checked end of a claim.
pub type FinishOf<T, OwnerCol, VCol> = GuardedUpdate<
    <T as diesel::associations::HasTable>::Table,
    Joined<
        ColumnEq<<T as HasStatus>::StatusColumn, <T as HasStatus>::Status>,
        ColumnEq<OwnerCol, Option<String>>,
        Comma,
    >,
    Increment<VCol>,
    <T as Guarded>::KeyPredicate,
    Joined<
        ColumnEq<<T as HasStatus>::StatusColumn, <T as HasStatus>::Status>,
        ColumnEq<OwnerCol, String>,
        crate::statement::And,
    >,
>;

/// Task claiming for version-guarded entities with a status column, an owner column
/// (`Nullable<Text>`) and a claim-time column (`Nullable<Timestamp>`).
pub trait GuardedClaim<VCol, V>:
    HasStatus + Clone + Guarded<Guard = VersionGuard<VCol, V>>
where
    VCol: Column + VersionColumnFor<V>,
    V: VersionNumber,
{
    /// Claims up to `request.limit` rows in state `from` (and abandoned claims, with
    /// `reclaim_after`), moving them to `to` with `request.owner` in `owner` and the
    /// database's now in `claimed_at`, in one write transaction. Returns the claimed rows
    /// as written; none when nothing is waiting. Each row goes to one worker.
    fn claim<C, OwnerCol, AtCol>(
        conn: &mut C,
        owner: OwnerCol,
        claimed_at: AtCol,
        request: &ClaimRequest<'_, Self::Status>,
    ) -> Result<Vec<Self>, Error>
    where
        C: LoadConnection + WriteTransaction,
        C::Backend: OccBackend,
        OwnerCol: Column<Table = Self::Table, SqlType = Nullable<Text>>,
        AtCol: Column<Table = Self::Table>,
        Self: LoadByKey<C> + Selectable<C::Backend>,
        Self::SelectExpression: QueryId,
        Self::Table: FilterDsl<Claimable<Self::StatusColumn, Self::Status, AtCol>>,
        Filter<Self::Table, Claimable<Self::StatusColumn, Self::Status, AtCol>>:
            SelectDsl<AsSelect<Self, C::Backend>>,
        Select<
            Filter<Self::Table, Claimable<Self::StatusColumn, Self::Status, AtCol>>,
            AsSelect<Self, C::Backend>,
        >: LimitDsl,
        ClaimQueryOf<Self, AtCol, C::Backend>: LoadQuery<'static, C, Self>,
        ClaimUpdateOf<Self, OwnerCol, AtCol, VCol>: ExecuteDsl<C> + CompareAndSet<C::Backend>,
    {
        let _ = (owner, claimed_at);
        crate::version_row::check_name("owner", request.owner)?;
        if request.limit == 0 {
            return Ok(Vec::new());
        }
        let filter = Claimable {
            from: request.from,
            to: request.to,
            abandoned_before: request.reclaim_after.map(Shift::earlier),
            columns: std::marker::PhantomData,
        };
        let limit = i64::try_from(request.limit).unwrap_or(i64::MAX);
        commit_operation(conn, |conn| {
            let query = SkipLocked(LimitDsl::limit(
                SelectDsl::select(FilterDsl::filter(Self::table(), filter), Self::as_select()),
                limit,
            ));
            let waiting: Vec<Self> = query.load(conn).map_err(|e| classify(conn, e))?;
            if waiting.is_empty() {
                return Ok(Vec::new());
            }
            let keys: Vec<Self::Key> = waiting.iter().map(Guarded::key).collect();
            let update = ClaimUpdateOf::<Self, OwnerCol, AtCol, VCol>::new(
                Self::table(),
                Joined(
                    Joined(
                        ColumnEq::new(request.to),
                        ColumnEq::new(Some(request.owner.to_string())),
                        Comma,
                    ),
                    StampNow::default(),
                    Comma,
                ),
                Increment::default(),
                AnyOf(keys.iter().map(Self::key_predicate).collect()),
                Unguarded,
            );
            let written = ExecuteDsl::execute(update, conn).map_err(|e| classify(conn, e))?;
            if written != keys.len() {
                return Err(Error::KeyNotUnique {
                    table: Self::table_name(),
                    key: format!("{keys:?}"),
                    rows: written,
                });
            }
            Self::load_by_keys(conn, &keys).map_err(|e| classify(conn, e))
        })
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
        C: LoadConnection,
        C::Backend: OccBackend,
        OwnerCol: Column<Table = Self::Table, SqlType = Nullable<Text>>,
        Self: LoadByKey<C>,
        FinishOf<Self, OwnerCol, VCol>: CompareAndSet<C::Backend>,
        crate::completion::Counted:
            crate::completion::Complete<C, FinishOf<Self, OwnerCol, VCol>, V>,
    {
        let _ = owner_column;
        let statement = FinishOf::<Self, OwnerCol, VCol>::new(
            Self::table(),
            Joined(
                ColumnEq::new(to),
                ColumnEq::new(next_owner.map(str::to_string)),
                Comma,
            ),
            Increment::default(),
            Self::key_predicate(key),
            Joined(
                ColumnEq::new(held),
                ColumnEq::new(owner.to_string()),
                crate::statement::And,
            ),
        );
        crate::update::execute_guarded::<C, _, crate::completion::Counted, V>(
            conn,
            statement,
            || (Self::table_name(), format!("{key:?}")),
            |conn| match Self::load_by_key(conn, key) {
                Ok(None) => Error::NotFound {
                    table: Self::table_name(),
                    key: format!("{key:?}"),
                },
                Ok(Some(_)) => Error::LockLost {
                    lock: format!(
                        "claim of `{}` row {key:?} by {owner:?} (in state `{}`)",
                        Self::table_name(),
                        held.name()
                    ),
                },
                Err(e) => classify(conn, e),
            },
        )
        .map(drop)
    }
}

impl<T, VCol, V> GuardedClaim<VCol, V> for T
where
    T: HasStatus + Clone + Guarded<Guard = VersionGuard<VCol, V>>,
    VCol: Column + VersionColumnFor<V>,
    V: VersionNumber,
{
}
