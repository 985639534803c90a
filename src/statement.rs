//! The SQL of a guarded write, as diesel query fragments.
//!
//! A guarded write is a compare-and-set on one row:
//! `UPDATE t SET <changes>, <advance> WHERE (<key>) AND <guard>`. The pieces are generic so
//! that every guard (version, timestamp, pre-image, status, fencing token) is the same
//! statement with a different `advance` and `guard`. Table and column names come from the
//! user's `table!` schema at compile time; every value is a bound parameter.

use std::marker::PhantomData;

use diesel::backend::Backend;
use diesel::query_builder::{AstPass, QueryFragment, QueryId};
use diesel::query_dsl::RunQueryDsl;
use diesel::sql_types::HasSqlType;
use diesel::{Column, QueryResult, Table};

/// `"column" = ?`: an assignment after `SET`, an equality test after `WHERE`.
#[derive(Debug, Clone, Copy)]
pub struct ColumnEq<Col, V> {
    value: V,
    column: PhantomData<Col>,
}

impl<Col, V> ColumnEq<Col, V> {
    /// `column = value`.
    pub fn new(value: V) -> Self {
        ColumnEq {
            value,
            column: PhantomData,
        }
    }
}

impl<Col, V, DB> QueryFragment<DB> for ColumnEq<Col, V>
where
    DB: Backend + HasSqlType<Col::SqlType>,
    Col: Column,
    V: diesel::serialize::ToSql<Col::SqlType, DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_identifier(Col::NAME)?;
        out.push_sql(" = ");
        out.push_bind_param::<Col::SqlType, V>(&self.value)
    }
}

impl<Col: 'static, V: 'static> QueryId for ColumnEq<Col, V> {
    type QueryId = Self;
    const HAS_STATIC_QUERY_ID: bool = true;
}

/// `UPDATE <table> SET <changes>, <advance> WHERE (<key>) AND <guard>`.
///
/// An empty `changes` (a changeset whose fields are all `None`) leaves just the
/// `advance`, so the statement stays valid and still proves and advances the token.
#[derive(Debug, Clone)]
pub struct GuardedUpdate<T: Table, Changes, Advance, Key, Guard> {
    from: T::FromClause,
    changes: Changes,
    advance: Advance,
    key: Key,
    guard: Guard,
}

impl<T: Table, Changes, Advance, Key, Guard> GuardedUpdate<T, Changes, Advance, Key, Guard> {
    /// The statement for `table`.
    pub fn new(table: T, changes: Changes, advance: Advance, key: Key, guard: Guard) -> Self {
        GuardedUpdate {
            from: table.from_clause(),
            changes,
            advance,
            key,
            guard,
        }
    }
}

impl<T, Changes, Advance, Key, Guard, DB> QueryFragment<DB>
    for GuardedUpdate<T, Changes, Advance, Key, Guard>
where
    DB: Backend,
    T: Table,
    T::FromClause: QueryFragment<DB>,
    Changes: QueryFragment<DB>,
    Advance: QueryFragment<DB>,
    Key: QueryFragment<DB>,
    Guard: QueryFragment<DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        // Like diesel's own UPDATE: whether `changes` is empty can differ per call.
        out.unsafe_to_cache_prepared();
        out.push_sql("UPDATE ");
        self.from.walk_ast(out.reborrow())?;
        out.push_sql(" SET ");
        if !self.changes.is_noop(out.backend())? {
            self.changes.walk_ast(out.reborrow())?;
            out.push_sql(", ");
        }
        self.advance.walk_ast(out.reborrow())?;
        out.push_sql(" WHERE (");
        self.key.walk_ast(out.reborrow())?;
        out.push_sql(") AND ");
        self.guard.walk_ast(out.reborrow())
    }
}

impl<T: Table, Changes, Advance, Key, Guard> QueryId
    for GuardedUpdate<T, Changes, Advance, Key, Guard>
{
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<T: Table, Changes, Advance, Key, Guard, Conn> RunQueryDsl<Conn>
    for GuardedUpdate<T, Changes, Advance, Key, Guard>
{
}

/// `DELETE FROM <table> WHERE (<key>) AND <guard>`.
#[derive(Debug, Clone)]
pub struct GuardedDelete<T: Table, Key, Guard> {
    from: T::FromClause,
    key: Key,
    guard: Guard,
}

impl<T: Table, Key, Guard> GuardedDelete<T, Key, Guard> {
    /// The statement for `table`.
    pub fn new(table: T, key: Key, guard: Guard) -> Self {
        GuardedDelete {
            from: table.from_clause(),
            key,
            guard,
        }
    }
}

impl<T, Key, Guard, DB> QueryFragment<DB> for GuardedDelete<T, Key, Guard>
where
    DB: Backend,
    T: Table,
    T::FromClause: QueryFragment<DB>,
    Key: QueryFragment<DB>,
    Guard: QueryFragment<DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_sql("DELETE FROM ");
        self.from.walk_ast(out.reborrow())?;
        out.push_sql(" WHERE (");
        self.key.walk_ast(out.reborrow())?;
        out.push_sql(") AND ");
        self.guard.walk_ast(out.reborrow())
    }
}

impl<T, Key, Guard> QueryId for GuardedDelete<T, Key, Guard>
where
    T: Table + QueryId,
    Key: QueryId,
    Guard: QueryId,
{
    type QueryId = (T::QueryId, Key::QueryId, Guard::QueryId);
    const HAS_STATIC_QUERY_ID: bool =
        T::HAS_STATIC_QUERY_ID && Key::HAS_STATIC_QUERY_ID && Guard::HAS_STATIC_QUERY_ID;
}

impl<T: Table, Key, Guard, Conn> RunQueryDsl<Conn> for GuardedDelete<T, Key, Guard> {}

/// The changeset of an entity with no updatable field besides key and version.
#[derive(Debug, Clone, Copy)]
pub struct NoChanges<T>(PhantomData<T>);

impl<T> Default for NoChanges<T> {
    fn default() -> Self {
        NoChanges(PhantomData)
    }
}

impl<T: Table> diesel::query_builder::AsChangeset for NoChanges<T> {
    type Target = T;
    type Changeset = Self;
    fn as_changeset(self) -> Self {
        self
    }
}

impl<T, DB: Backend> QueryFragment<DB> for NoChanges<T> {
    fn walk_ast<'b>(&'b self, _: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        Ok(())
    }
    fn is_noop(&self, _: &DB) -> QueryResult<bool> {
        Ok(true)
    }
}

/// A `SELECT` that sees the latest committed row, even inside a transaction whose
/// snapshot is older. Used to explain a write that matched no row.
///
/// A guarded `UPDATE` always compares against the latest committed row. Under MySQL's
/// default REPEATABLE READ a plain `SELECT` inside the same transaction would still show
/// the transaction's old snapshot, so the "current" row of a conflict could be the very
/// version the caller holds. `LOCK IN SHARE MODE` makes the read a current read there
/// (its shared lock lasts until the caller's transaction ends, or the statement when
/// there is none). PostgreSQL (READ COMMITTED reads fresh per statement; stricter levels
/// fail the `UPDATE` itself with a serialization error) and SQLite (a stale snapshot
/// cannot write at all: busy) need no suffix.
#[derive(Debug, Clone)]
pub struct LatestRead<Q>(Q);

impl<Q> LatestRead<Q> {
    /// `query`, read as the latest committed row.
    pub fn new(query: Q) -> Self {
        LatestRead(query)
    }
}

/// What a backend appends to a `SELECT` so that it reads the latest committed row.
pub trait LatestReadSql: Backend {
    /// The suffix, with a leading space, or empty.
    const SUFFIX: &'static str;
}

#[cfg(feature = "sqlite")]
impl LatestReadSql for diesel::sqlite::Sqlite {
    const SUFFIX: &'static str = "";
}

#[cfg(feature = "postgres")]
impl LatestReadSql for diesel::pg::Pg {
    const SUFFIX: &'static str = "";
}

#[cfg(feature = "mysql")]
impl LatestReadSql for diesel::mysql::Mysql {
    const SUFFIX: &'static str = " LOCK IN SHARE MODE";
}

impl<Q: diesel::query_builder::Query> diesel::query_builder::Query for LatestRead<Q> {
    type SqlType = Q::SqlType;
}

impl<Q, DB> QueryFragment<DB> for LatestRead<Q>
where
    DB: LatestReadSql,
    Q: QueryFragment<DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        self.0.walk_ast(out.reborrow())?;
        out.push_sql(DB::SUFFIX);
        Ok(())
    }
}

impl<Q: QueryId> QueryId for LatestRead<Q> {
    type QueryId = LatestRead<Q::QueryId>;
    const HAS_STATIC_QUERY_ID: bool = Q::HAS_STATIC_QUERY_ID;
}

impl<Q, Conn> RunQueryDsl<Conn> for LatestRead<Q> {}
