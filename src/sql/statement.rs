//! The SQL of a guarded write, as diesel query fragments.
//!
//! A guarded write is a compare-and-set on one row:
//! `UPDATE t SET <changes>, <advance> WHERE (<key>) AND <guard>`. The pieces are generic so
//! that every guard (version, timestamp, pre-image, status, fencing token) is the same
//! statement with a different `advance` and `guard`. Table and column names come from the
//! user's `table!` schema at compile time; every value is a bound parameter.

use std::marker::PhantomData;

use diesel::backend::Backend;

use crate::connect::backend::OccBackend;
use diesel::expression::{AppearsOnTable, Expression, ValidGrouping};
use diesel::query_builder::{AstPass, QueryFragment, QueryId};
use diesel::query_dsl::RunQueryDsl;
use diesel::sql_types::{Bool, HasSqlType};
use diesel::{Column, QueryResult, Table};

use crate::sql::values_update::Template;

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

    /// The value compared or assigned.
    pub fn value(&self) -> &V {
        &self.value
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
/// `advance`, so the statement stays valid and still proves and advances the token. An
/// [`Unguarded`] `advance` and `guard` leave a plain keyed update, for the fields a guard
/// excludes.
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
    // The statement may be cached as a prepared statement. Its `QueryId` is not static,
    // so diesel keys the cache by the SQL text: a changeset whose `None` fields leave
    // columns out renders other SQL and gets its own entry, never a wrong one. A changeset
    // type with n optional fields makes at most 2^n entries; fragments whose SQL depends
    // on their values (`IN` lists) mark themselves uncacheable as they walk.
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        self.walk_head(out.reborrow())?;
        self.walk_filter(out)
    }
}

impl<T, Changes, Advance, Key, Guard> GuardedUpdate<T, Changes, Advance, Key, Guard>
where
    T: Table,
{
    /// `UPDATE <table> SET <changes>, <advance>`: the statement up to its filter.
    fn walk_head<'b, DB>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()>
    where
        DB: Backend,
        T::FromClause: QueryFragment<DB>,
        Changes: QueryFragment<DB>,
        Advance: QueryFragment<DB>,
    {
        let backend = out.backend();
        let (changes, advance) = (
            !self.changes.is_noop(backend)?,
            !self.advance.is_noop(backend)?,
        );
        if !changes && !advance {
            return Err(diesel::result::Error::QueryBuilderError(
                "a guarded update with nothing to set: the changeset is empty and the guard \
                 sets nothing itself (an `xmin` or pre-image guard cannot be touched)"
                    .into(),
            ));
        }
        out.push_sql("UPDATE ");
        self.from.walk_ast(out.reborrow())?;
        out.push_sql(" SET ");
        if changes {
            self.changes.walk_ast(out.reborrow())?;
        }
        if changes && advance {
            out.push_sql(", ");
        }
        if advance {
            self.advance.walk_ast(out.reborrow())?;
        }
        Ok(())
    }

    /// ` WHERE (<key>) AND <guard>`: the statement's filter.
    fn walk_filter<'b, DB>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()>
    where
        DB: Backend,
        Key: QueryFragment<DB>,
        Guard: QueryFragment<DB>,
    {
        out.push_sql(" WHERE (");
        self.key.walk_ast(out.reborrow())?;
        out.push_sql(")");
        if !self.guard.is_noop(out.backend())? {
            out.push_sql(" AND ");
            self.guard.walk_ast(out.reborrow())?;
        }
        Ok(())
    }
}

/// [`GuardedUpdate::walk_head`] as a fragment of its own, to learn where the filter starts.
struct UpdateHead<'a, S>(&'a S);

impl<T, Changes, Advance, Key, Guard, DB> QueryFragment<DB>
    for UpdateHead<'_, GuardedUpdate<T, Changes, Advance, Key, Guard>>
where
    DB: Backend,
    T: Table,
    T::FromClause: QueryFragment<DB>,
    Changes: QueryFragment<DB>,
    Advance: QueryFragment<DB>,
{
    fn walk_ast<'b>(&'b self, out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        self.0.walk_head(out)
    }
}

impl<T, Changes, Advance, Key, Guard, DB> Template<DB>
    for GuardedUpdate<T, Changes, Advance, Key, Guard>
where
    DB: OccBackend,
    T: Table,
    T::FromClause: QueryFragment<DB>,
    Changes: QueryFragment<DB>,
    Advance: QueryFragment<DB>,
    Key: QueryFragment<DB>,
    Guard: QueryFragment<DB>,
{
    fn filter_at(&self) -> QueryResult<usize> {
        Ok(DB::render(&UpdateHead(self))?.len())
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

impl<T, Changes, Advance, Key, Guard> GuardedUpdate<T, Changes, Advance, Key, Guard>
where
    T: Table,
    T::FromClause: Clone,
    Key: Clone,
{
    /// `SELECT <Col> FROM <table> WHERE (<key>)`: column `Col` of the row this statement
    /// writes, for a backend without `RETURNING` to read a token the server computed.
    pub fn read_back<Col>(&self) -> ColumnOfRow<T, Key, Col> {
        ColumnOfRow {
            from: self.from.clone(),
            key: self.key.clone(),
            column: PhantomData,
        }
    }
}

#[cfg(feature = "mysql")]
impl<T: Table, Changes, Advance, Key, Guard> GuardedUpdate<T, Changes, Advance, Key, Guard> {
    /// This statement, also noting the version it leaves in column `Col` in the
    /// session's `LAST_INSERT_ID` ([`NoteVersion`]), for MySQL to read it back without
    /// `RETURNING` and without a transaction.
    pub(crate) fn noting_version<Col>(self) -> NotingVersion<T, Changes, Advance, Key, Guard, Col> {
        GuardedUpdate {
            from: self.from,
            changes: self.changes,
            advance: Joined(self.advance, NoteVersion(PhantomData), Comma),
            key: self.key,
            guard: self.guard,
        }
    }
}

/// A guarded update that also notes the version it leaves in `Col`.
#[cfg(feature = "mysql")]
pub(crate) type NotingVersion<T, Changes, Advance, Key, Guard, Col> =
    GuardedUpdate<T, Changes, AlsoSet<Advance, NoteVersion<Col>>, Key, Guard>;

/// MySQL: `` `v` = CAST(LAST_INSERT_ID(`v` + CAST(0 * (@occ_prev := LAST_INSERT_ID()) AS
/// SIGNED)) AS SIGNED) `` after the
/// assignments: MySQL assigns from left to right, so this sets the version column to
/// the value the statement just gave it, and notes that value in the session's
/// `LAST_INSERT_ID`, after keeping the caller's last insert id in `@occ_prev`.
/// [`ReadNotedVersion`] reads the note and puts the caller's value back. A row the
/// statement does not match evaluates none of it.
#[cfg(feature = "mysql")]
#[derive(Debug, Clone, Copy)]
pub struct NoteVersion<Col>(PhantomData<Col>);

#[cfg(feature = "mysql")]
impl<Col: Column> QueryFragment<diesel::mysql::Mysql> for NoteVersion<Col> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, diesel::mysql::Mysql>) -> QueryResult<()> {
        out.push_identifier(Col::NAME)?;
        // `LAST_INSERT_ID` is unsigned: without the casts a negative version would make
        // the sum unsigned and fail the statement (out of range).
        out.push_sql(" = CAST(LAST_INSERT_ID(");
        out.push_identifier(Col::NAME)?;
        out.push_sql(" + CAST(0 * (@occ_prev := LAST_INSERT_ID()) AS SIGNED)) AS SIGNED)");
        Ok(())
    }
}

/// `SELECT LAST_INSERT_ID(), LAST_INSERT_ID(@occ_prev)`: the version a [`NoteVersion`]
/// statement noted, and the caller's last insert id put back (`LAST_INSERT_ID(expr)`
/// makes `expr` the session's value again). A query type of its own, not `sql_query`,
/// so that diesel prepares it once per connection: a raw query is prepared and closed
/// on every call, a round trip more each time.
#[cfg(feature = "mysql")]
#[derive(Debug, Clone, Copy, diesel::query_builder::QueryId)]
pub(crate) struct ReadNotedVersion;

#[cfg(feature = "mysql")]
impl diesel::query_builder::Query for ReadNotedVersion {
    type SqlType = (
        diesel::sql_types::Unsigned<diesel::sql_types::BigInt>,
        diesel::sql_types::Nullable<diesel::sql_types::Unsigned<diesel::sql_types::BigInt>>,
    );
}

#[cfg(feature = "mysql")]
impl QueryFragment<diesel::mysql::Mysql> for ReadNotedVersion {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, diesel::mysql::Mysql>) -> QueryResult<()> {
        out.push_sql("SELECT LAST_INSERT_ID(), LAST_INSERT_ID(@occ_prev)");
        Ok(())
    }
}

#[cfg(feature = "mysql")]
impl<C> diesel::RunQueryDsl<C> for ReadNotedVersion {}

/// A row of [`ReadNotedVersion`].
#[cfg(feature = "mysql")]
#[derive(diesel::Queryable)]
pub(crate) struct NotedVersion {
    pub(crate) noted: u64,
    /// NULL only if something else set `@occ_prev` to NULL; nothing to report then.
    pub(crate) _restored: Option<u64>,
}

/// `SELECT <Col> FROM <table> WHERE (<key>)`; see [`GuardedUpdate::read_back`].
#[derive(Debug, Clone)]
pub struct ColumnOfRow<T: Table, Key, Col> {
    from: T::FromClause,
    key: Key,
    column: PhantomData<Col>,
}

impl<T: Table, Key, Col> ColumnOfRow<T, Key, Col> {
    /// `SELECT <Col> FROM <table> WHERE (<filter>)`.
    #[cfg(feature = "locks")]
    pub(crate) fn new(table: T, filter: Key) -> Self {
        ColumnOfRow {
            from: table.from_clause(),
            key: filter,
            column: PhantomData,
        }
    }
}

impl<T: Table, Key, Col: Column> diesel::query_builder::Query for ColumnOfRow<T, Key, Col> {
    type SqlType = Col::SqlType;
}

impl<T, Key, Col, DB> QueryFragment<DB> for ColumnOfRow<T, Key, Col>
where
    DB: Backend,
    T: Table,
    T::FromClause: QueryFragment<DB>,
    Key: QueryFragment<DB>,
    Col: Column,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_sql("SELECT ");
        out.push_identifier(Col::NAME)?;
        out.push_sql(" FROM ");
        self.from.walk_ast(out.reborrow())?;
        out.push_sql(" WHERE (");
        self.key.walk_ast(out.reborrow())?;
        out.push_sql(")");
        Ok(())
    }
}

impl<T: Table, Key, Col> QueryId for ColumnOfRow<T, Key, Col> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<T: Table, Key, Col, Conn> RunQueryDsl<Conn> for ColumnOfRow<T, Key, Col> {}

/// What the executor checks in a compare-and-set statement before sending it.
pub trait Assignments<DB> {
    /// A column that both the caller's changes and the guard's advance assign, by its SQL
    /// name. PostgreSQL rejects such a statement; MySQL and SQLite would keep one of
    /// the two values silently, so the executor refuses it on every backend.
    fn assigned_twice(&self) -> QueryResult<Option<String>>;

    /// How many times the caller's part of the statement assigns `column` (SQL name): a
    /// status column that only transitions move must not be among an ordinary write's
    /// changes. Statements without a `SET` list assign nothing.
    fn assignments_to(&self, column: &str) -> QueryResult<usize> {
        let _ = column;
        Ok(0)
    }
}

impl<T, Changes, Advance, Key, Guard, DB> Assignments<DB>
    for GuardedUpdate<T, Changes, Advance, Key, Guard>
where
    DB: OccBackend,
    T: Table,
    Changes: QueryFragment<DB>,
    Advance: QueryFragment<DB>,
{
    // On every write's path: the quoted names are compared as rendered (one backend
    // quotes both alike), and only a clash is unquoted for its message.
    fn assigned_twice(&self) -> QueryResult<Option<String>> {
        let backend = DB::default();
        if self.advance.is_noop(&backend)? || self.changes.is_noop(&backend)? {
            // Nothing the guard sets (a pre-image, an unguarded write), or nothing else.
            return Ok(None);
        }
        let (advance, changes) = (DB::render(&self.advance)?, DB::render(&self.changes)?);
        let guarded = assignment_targets(&advance);
        Ok(assignment_targets(&changes)
            .into_iter()
            .find(|target| guarded.contains(target))
            .map(crate::sql::names::unquote))
    }

    fn assignments_to(&self, column: &str) -> QueryResult<usize> {
        Ok(assigned_columns::<DB, _>(&self.changes)?
            .iter()
            .filter(|assigned| *assigned == column)
            .count())
    }
}

impl<T: Table, Key, Guard, DB> Assignments<DB> for GuardedDelete<T, Key, Guard> {
    fn assigned_twice(&self) -> QueryResult<Option<String>> {
        Ok(None)
    }
}

/// The columns a changeset (or a guard's advance) assigns, by their SQL names, in order.
pub(crate) fn assigned_columns<DB, F>(changes: &F) -> QueryResult<Vec<String>>
where
    DB: OccBackend,
    F: QueryFragment<DB>,
{
    if changes.is_noop(&DB::default())? {
        return Ok(Vec::new());
    }
    let sql = DB::render(changes)?;
    Ok(assignment_targets(&sql)
        .into_iter()
        .map(crate::sql::names::unquote)
        .collect())
}

/// The assigned columns of a rendered `SET` list (`"a" = $1, "b" = $2 + 1`): the text
/// before the first top-level ` = ` of each top-level, comma-separated item. Commas and
/// `=` inside parentheses or quotes belong to expressions, not to the list. Values are
/// bind parameters, so the text is the schema's and the developer's, never user data.
fn assignment_targets(set_list: &str) -> Vec<&str> {
    let mut targets = Vec::new();
    let (mut depth, mut quote, mut item_start) = (0usize, None, 0usize);
    let mut target_end = None;
    let bytes = set_list.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        match (quote, b) {
            // A doubled quote inside a quoted part re-opens it on the next byte.
            (Some(q), _) if b == q => quote = None,
            (Some(_), _) => {}
            (None, b'"' | b'`' | b'\'') => quote = Some(b),
            (None, b'(') => depth += 1,
            (None, b')') => depth = depth.saturating_sub(1),
            (None, b'=') if depth == 0 && target_end.is_none() => target_end = Some(i),
            (None, b',') if depth == 0 => {
                if let Some(end) = target_end.take() {
                    targets.push(set_list[item_start..end].trim());
                }
                item_start = i + 1;
            }
            _ => {}
        }
    }
    if let Some(end) = target_end {
        targets.push(set_list[item_start..end].trim());
    }
    targets
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

/// `<a><separator><b>`, leaving out whichever part is empty: assignments joined by `, `
/// ([`AlsoSet`]) or conditions joined by ` AND ` (a pre-image's `AllOf`).
#[derive(Debug, Clone, Copy)]
pub struct Joined<A, B, Sep>(pub A, pub B, pub Sep);

/// What goes between the two parts of a [`Joined`].
pub trait Separator {
    /// The SQL between the parts, with spaces.
    const SQL: &'static str;
}

/// `, `: between assignments.
#[derive(Debug, Clone, Copy, Default)]
pub struct Comma;

/// ` AND `: between conditions.
#[derive(Debug, Clone, Copy, Default)]
pub struct And;

impl Separator for Comma {
    const SQL: &'static str = ", ";
}

impl Separator for And {
    const SQL: &'static str = " AND ";
}

/// The guard's assignments and the entity's stamp (`#[occ(updated_at)]`).
pub(crate) type AlsoSet<A, B> = Joined<A, B, Comma>;

impl<A, B, Sep, DB> QueryFragment<DB> for Joined<A, B, Sep>
where
    DB: Backend,
    A: QueryFragment<DB>,
    B: QueryFragment<DB>,
    Sep: Separator,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        let backend = out.backend();
        let (first, second) = (!self.0.is_noop(backend)?, !self.1.is_noop(backend)?);
        if first {
            self.0.walk_ast(out.reborrow())?;
        }
        if first && second {
            out.push_sql(Sep::SQL);
        }
        if second {
            self.1.walk_ast(out.reborrow())?;
        }
        Ok(())
    }
}

impl<A, B, Sep> QueryId for Joined<A, B, Sep> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

/// No assignment and no condition: the `advance` and `guard` of an unguarded write.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unguarded;

impl<DB: Backend> QueryFragment<DB> for Unguarded {
    fn walk_ast<'b>(&'b self, _: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        Ok(())
    }
    fn is_noop(&self, _: &DB) -> QueryResult<bool> {
        Ok(true)
    }
}

impl QueryId for Unguarded {
    type QueryId = Self;
    const HAS_STATIC_QUERY_ID: bool = true;
}

/// `(<p0>) OR (<p1>) ...`: rows matching any of the predicates, such as several keys in
/// one read. Never empty: an empty list would select nothing, so callers skip the read.
#[derive(Debug, Clone)]
pub struct AnyOf<P>(pub Vec<P>);

impl<P: Expression<SqlType = Bool>> Expression for AnyOf<P> {
    type SqlType = Bool;
}

impl<P, QS> AppearsOnTable<QS> for AnyOf<P> where P: AppearsOnTable<QS> + Expression<SqlType = Bool> {}

impl<P: ValidGrouping<()>> ValidGrouping<()> for AnyOf<P> {
    type IsAggregate = P::IsAggregate;
}

impl<P: QueryFragment<DB>, DB: Backend> QueryFragment<DB> for AnyOf<P> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        // The text depends on the number of predicates: keep it out of the cache.
        out.unsafe_to_cache_prepared();
        if self.0.is_empty() {
            out.push_sql("1 = 0");
        }
        for (i, predicate) in self.0.iter().enumerate() {
            if i > 0 {
                out.push_sql(" OR ");
            }
            out.push_sql("(");
            predicate.walk_ast(out.reborrow())?;
            out.push_sql(")");
        }
        Ok(())
    }
}

impl<P> QueryId for AnyOf<P> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

/// A `SELECT` that sees the latest committed row, even inside a transaction whose
/// snapshot is older. Used to explain a write that matched no row.
///
/// A guarded `UPDATE` always compares against the latest committed row, so its miss must
/// be explained by that row too. Outside a transaction every statement reads the latest
/// committed row. Inside one, a plain `SELECT` may show the transaction's snapshot
/// (MySQL REPEATABLE READ, PostgreSQL REPEATABLE READ and SERIALIZABLE), so the read is
/// made a locking one ([`OccBackend::LOCKING_READ`]): it sees the latest row, or on
/// PostgreSQL fails with a retryable serialization failure when the snapshot cannot act on
/// it. The lock lasts until the caller's transaction ends; it is the lock the caller's
/// next write of that row takes anyway, so a merge written in the same transaction cannot
/// conflict again. SQLite needs no clause: a stale snapshot cannot write at all (busy).
#[derive(Debug, Clone)]
pub struct LatestRead<Q> {
    query: Q,
    lock: RowLock,
}

/// The lock a [`LatestRead`] takes on the rows it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowLock {
    /// None: a plain read.
    None,
    /// The lock that makes the read see the latest row ([`OccBackend::LOCKING_READ`]).
    Latest,
    /// `FOR UPDATE`: held until the transaction ends ([`OccBackend::FOR_UPDATE`]).
    ForUpdate,
    /// `FOR UPDATE SKIP LOCKED`: rows other transactions hold are left out
    /// ([`OccBackend::SKIP_LOCKED`]).
    SkipLocked,
}

impl<Q> LatestRead<Q> {
    /// `query`, read as the latest committed row; `locking` inside a transaction.
    pub fn new(query: Q, locking: bool) -> Self {
        let lock = if locking {
            RowLock::Latest
        } else {
            RowLock::None
        };
        LatestRead { query, lock }
    }

    /// `query` with the row lock `lock`.
    pub fn locked(query: Q, lock: RowLock) -> Self {
        LatestRead { query, lock }
    }
}

impl<Q: diesel::query_builder::Query> diesel::query_builder::Query for LatestRead<Q> {
    type SqlType = Q::SqlType;
}

impl<Q, DB> QueryFragment<DB> for LatestRead<Q>
where
    DB: OccBackend,
    Q: QueryFragment<DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        self.query.walk_ast(out.reborrow())?;
        out.push_sql(match self.lock {
            RowLock::None => "",
            RowLock::Latest => DB::LOCKING_READ,
            RowLock::ForUpdate => DB::FOR_UPDATE,
            RowLock::SkipLocked => DB::SKIP_LOCKED,
        });
        Ok(())
    }
}

// The lock clause depends on a value, so the SQL text keys the statement cache.
impl<Q> QueryId for LatestRead<Q> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<Q, Conn> RunQueryDsl<Conn> for LatestRead<Q> {}

/// `"version" = "version" + 1`.
#[derive(Debug, Clone, Copy)]
pub struct Increment<Col>(PhantomData<Col>);

impl<Col> Default for Increment<Col> {
    fn default() -> Self {
        Increment(PhantomData)
    }
}

impl<Col: Column, DB: Backend> QueryFragment<DB> for Increment<Col> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_identifier(Col::NAME)?;
        out.push_sql(" = ");
        out.push_identifier(Col::NAME)?;
        out.push_sql(" + 1");
        Ok(())
    }
}

/// `(<a> OR <b>)`.
#[cfg(feature = "locks")]
#[derive(Debug, Clone, Copy, Default)]
pub struct Either<A, B>(pub A, pub B);

#[cfg(feature = "locks")]
impl<A, B, DB> QueryFragment<DB> for Either<A, B>
where
    DB: Backend,
    A: QueryFragment<DB>,
    B: QueryFragment<DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_sql("(");
        self.0.walk_ast(out.reborrow())?;
        out.push_sql(" OR ");
        self.1.walk_ast(out.reborrow())?;
        out.push_sql(")");
        Ok(())
    }
}

/// `NOT (<p>)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Not<P>(pub P);

impl<P: QueryFragment<DB>, DB: Backend> QueryFragment<DB> for Not<P> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_sql("NOT (");
        self.0.walk_ast(out.reborrow())?;
        out.push_sql(")");
        Ok(())
    }
}

/// `"column" IS NULL` after `WHERE`, `"column" = NULL` after `SET`.
#[cfg(feature = "locks")]
#[derive(Debug, Clone, Copy)]
pub struct Null<Col> {
    operator: &'static str,
    column: PhantomData<Col>,
}

#[cfg(feature = "locks")]
impl<Col> Null<Col> {
    /// `"column" IS NULL`.
    pub fn test() -> Self {
        Null {
            operator: " IS NULL",
            column: PhantomData,
        }
    }

    /// `"column" = NULL`.
    pub fn set() -> Self {
        Null {
            operator: " = NULL",
            column: PhantomData,
        }
    }
}

#[cfg(feature = "locks")]
impl<Col: Column, DB: Backend> QueryFragment<DB> for Null<Col> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_identifier(Col::NAME)?;
        out.push_sql(self.operator);
        Ok(())
    }
}

/// `<insert>` unless a row with its key exists: `ON CONFLICT DO NOTHING`, or on MySQL
/// `ON DUPLICATE KEY UPDATE <Col> = <Col>` (a no-op assignment of a column `Col` of the
/// table). One statement, so that two first users at once find one row.
#[derive(Debug, Clone)]
pub struct InsertIfMissing<I, Col> {
    insert: I,
    column: PhantomData<Col>,
}

impl<I, Col> InsertIfMissing<I, Col> {
    /// `insert`, leaving an existing row alone.
    pub fn new(insert: I) -> Self {
        InsertIfMissing {
            insert,
            column: PhantomData,
        }
    }
}

impl<I, Col, DB> QueryFragment<DB> for InsertIfMissing<I, Col>
where
    DB: OccBackend,
    I: QueryFragment<DB>,
    Col: Column,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        self.insert.walk_ast(out.reborrow())?;
        match DB::DUPLICATES {
            crate::connect::backend::Duplicates::OnConflict => {
                out.push_sql(" ON CONFLICT DO NOTHING")
            }
            crate::connect::backend::Duplicates::OnDuplicateKey => {
                out.push_sql(" ON DUPLICATE KEY UPDATE ");
                out.push_identifier(Col::NAME)?;
                out.push_sql(" = ");
                out.push_identifier(Col::NAME)?;
            }
        }
        Ok(())
    }
}

impl<I, Col> QueryId for InsertIfMissing<I, Col> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

// An insert sets each column it names once: diesel's `Insertable` lists each field once.
impl<T, U, Op, Ret, DB> Assignments<DB> for diesel::query_builder::InsertStatement<T, U, Op, Ret>
where
    T: Table,
{
    fn assigned_twice(&self) -> QueryResult<Option<String>> {
        Ok(None)
    }
}

impl<I, Col, DB> Assignments<DB> for InsertIfMissing<I, Col> {
    fn assigned_twice(&self) -> QueryResult<Option<String>> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::assignment_targets;

    #[test]
    fn set_list_targets_ignore_commas_and_equals_inside_expressions() {
        assert_eq!(
            assignment_targets("\"note\" = $1, \"version\" = $2"),
            ["\"note\"", "\"version\""]
        );
        assert_eq!(
            assignment_targets("`a` = coalesce(?, `b` = ?), `c` = ? = ?"),
            ["`a`", "`c`"]
        );
        assert_eq!(assignment_targets("`a` = 'x, `b` = y'"), ["`a`"]);
        assert_eq!(assignment_targets("\"odd\"\"=,\" = $1"), ["\"odd\"\"=,\""]);
        assert!(assignment_targets("").is_empty());
    }
}

/// `<statement> RETURNING <row>`: a write that answers with the rows it wrote
/// (PostgreSQL, SQLite; see [`OccBackend::RETURNING`]).
#[cfg(feature = "locks")]
#[derive(Debug, Clone)]
pub struct Returning<S, Row> {
    statement: S,
    row: Row,
}

#[cfg(feature = "locks")]
impl<S, Row> Returning<S, Row> {
    /// `statement`, answering with `row` of each row it wrote.
    pub fn new(statement: S, row: Row) -> Self {
        Returning { statement, row }
    }
}

#[cfg(feature = "locks")]
impl<S, Row, DB> QueryFragment<DB> for Returning<S, Row>
where
    DB: Backend,
    S: QueryFragment<DB>,
    Row: QueryFragment<DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        self.statement.walk_ast(out.reborrow())?;
        out.push_sql(" RETURNING ");
        self.row.walk_ast(out)
    }
}

#[cfg(feature = "locks")]
impl<S, Row: Expression> diesel::query_builder::Query for Returning<S, Row> {
    type SqlType = Row::SqlType;
}

#[cfg(feature = "locks")]
impl<S, Row> QueryId for Returning<S, Row> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

#[cfg(feature = "locks")]
impl<S, Row, Conn> RunQueryDsl<Conn> for Returning<S, Row> {}
