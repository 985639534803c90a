//! How a guarded statement runs, and how the writer learns the row's new token.
//!
//! Most guard kinds compute the next token before sending (a version, a timestamp), so
//! the statement is executed and its rows counted ([`Counted`]). A token only the
//! database knows (PostgreSQL's `xmin`, a database-clock stamp) is read back by the
//! statement itself (`... RETURNING <column>`, [`ReturnedBy`]): one round trip either
//! way, except on MySQL, which has no `RETURNING` and reads the column in the same
//! transaction.

use std::marker::PhantomData;

#[cfg(any(feature = "postgres", feature = "sqlite"))]
use diesel::backend::Backend;
use diesel::connection::Connection;
use diesel::query_builder::QueryFragment;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
use diesel::query_builder::{AstPass, Query, QueryId};
use diesel::query_dsl::methods::ExecuteDsl;
use diesel::{Column, QueryResult, RunQueryDsl};

use crate::connect::backend::OccBackend;
use crate::sql::values_update::{RowAndToken, RowOnly, Template, ValuesUpdate};

/// Runs a guarded statement on connection `C`: the rows it matched and, for kinds whose
/// next token only the database knows, that token.
#[diagnostic::on_unimplemented(
    message = "this guard cannot run its statement on `{C}`",
    note = "the statement, its guard's assignments or the token's column type do not fit this connection's backend"
)]
pub trait Complete<C, S, Tok> {
    /// Runs `statement` on `conn`.
    fn run(conn: &mut C, statement: S, own: bool) -> QueryResult<(usize, Option<Tok>)>;
}

/// The next token was computed before sending: execute and count.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counted;

impl<C, S, Tok> Complete<C, S, Tok> for Counted
where
    C: Connection,
    S: ExecuteDsl<C>,
{
    fn run(conn: &mut C, statement: S, _own: bool) -> QueryResult<(usize, Option<Tok>)> {
        ExecuteDsl::execute(statement, conn).map(|rows| (rows, None))
    }
}

/// The next token is column `Col` as the statement left it: `... RETURNING <Col>` on
/// PostgreSQL and SQLite; on MySQL, which has no `RETURNING`, the statement and a read of
/// the column in one transaction ([`ReadsBack`]).
#[derive(Debug, Clone, Copy, Default)]
#[allow(unreachable_pub)] // reached through the guards of features `chrono` and `postgres`
pub struct ReturnedBy<Col>(PhantomData<Col>);

impl<C, S, Col, Tok> Complete<C, S, Tok> for ReturnedBy<Col>
where
    C: Connection,
    C::Backend: ReadsBack<C, S, Col, Tok>,
{
    fn run(conn: &mut C, statement: S, own: bool) -> QueryResult<(usize, Option<Tok>)> {
        <C::Backend as ReadsBack<C, S, Col, Tok>>::run(conn, statement, own)
    }
}

/// How backend `Self` runs `statement` and reads back the column `Col` it set.
#[diagnostic::on_unimplemented(
    message = "this guard cannot read its new token back on `{Self}`",
    note = "an `xmin` guard is PostgreSQL's; a last-modified guard on the database's clock reads its stamp back on every backend"
)]
#[allow(unreachable_pub)] // reached through the guards of features `chrono` and `postgres`
pub trait ReadsBack<C, S, Col, Tok> {
    /// Runs `statement` on `conn`: the rows it matched and the token it left.
    fn run(conn: &mut C, statement: S, own: bool) -> QueryResult<(usize, Option<Tok>)>;
}

/// `<statement> RETURNING <Col>`: one round trip.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
fn load_returning<C, S, Col, Tok>(conn: &mut C, statement: S) -> QueryResult<(usize, Option<Tok>)>
where
    Returning<S, Col>: diesel::query_dsl::LoadQuery<'static, C, Tok>,
{
    let tokens: Vec<Tok> = Returning::<S, Col>::new(statement).load(conn)?;
    Ok((tokens.len(), tokens.into_iter().next()))
}

#[cfg(feature = "postgres")]
impl<C, S, Col, Tok> ReadsBack<C, S, Col, Tok> for diesel::pg::Pg
where
    C: Connection<Backend = Self>,
    Returning<S, Col>: diesel::query_dsl::LoadQuery<'static, C, Tok>,
{
    fn run(conn: &mut C, statement: S, _own: bool) -> QueryResult<(usize, Option<Tok>)> {
        load_returning::<C, S, Col, Tok>(conn, statement)
    }
}

#[cfg(feature = "sqlite")]
impl<C, S, Col, Tok> ReadsBack<C, S, Col, Tok> for diesel::sqlite::Sqlite
where
    C: Connection<Backend = Self>,
    Returning<S, Col>: diesel::query_dsl::LoadQuery<'static, C, Tok>,
{
    fn run(conn: &mut C, statement: S, _own: bool) -> QueryResult<(usize, Option<Tok>)> {
        load_returning::<C, S, Col, Tok>(conn, statement)
    }
}

/// No `RETURNING`: the statement, then `SELECT <Col>` of its row, in one transaction so
/// that no other writer's value can come between. The row stays locked by the write.
#[cfg(feature = "mysql")]
impl<C, T, Changes, Advance, Key, Guard, Col, Tok>
    ReadsBack<C, crate::sql::statement::GuardedUpdate<T, Changes, Advance, Key, Guard>, Col, Tok>
    for diesel::mysql::Mysql
where
    C: Connection<Backend = Self>,
    T: diesel::Table,
    T::FromClause: Clone,
    Key: Clone,
    crate::sql::statement::GuardedUpdate<T, Changes, Advance, Key, Guard>: ExecuteDsl<C>,
    crate::sql::statement::ColumnOfRow<T, Key, Col>: diesel::query_dsl::LoadQuery<'static, C, Tok>,
{
    fn run(
        conn: &mut C,
        statement: crate::sql::statement::GuardedUpdate<T, Changes, Advance, Key, Guard>,
        own: bool,
    ) -> QueryResult<(usize, Option<Tok>)> {
        execute_then_read::<C, T, Changes, Advance, Key, Guard, Col, Tok>(conn, statement, own)
    }
}

/// The row a statement wrote a moment ago in this transaction is gone: the server aborted
/// the transaction under it (a Galera node, for a conflicting write from another node,
/// whose reply to the write claimed success). Retryable: nothing of it stays.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) fn aborted_under_write() -> diesel::result::Error {
    diesel::result::Error::DatabaseError(
        diesel::result::DatabaseErrorKind::SerializationFailure,
        Box::new(
            "the row just written is not there: the server aborted the transaction".to_string(),
        ),
    )
}

/// The statement, then `SELECT <Col>` of the row it wrote, in one transaction (a
/// savepoint inside the caller's): the value the row holds after the statement and its
/// triggers, with no other writer's in between.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
fn execute_then_read<C, T, Changes, Advance, Key, Guard, Col, Tok>(
    conn: &mut C,
    statement: crate::sql::statement::GuardedUpdate<T, Changes, Advance, Key, Guard>,
    own: bool,
) -> QueryResult<(usize, Option<Tok>)>
where
    C: Connection,
    T: diesel::Table,
    T::FromClause: Clone,
    Key: Clone,
    crate::sql::statement::GuardedUpdate<T, Changes, Advance, Key, Guard>: ExecuteDsl<C>,
    crate::sql::statement::ColumnOfRow<T, Key, Col>: diesel::query_dsl::LoadQuery<'static, C, Tok>,
{
    let read = statement.read_back::<Col>();
    let write_then_read = |conn: &mut C| match ExecuteDsl::execute(statement, conn)? {
        1 => match read.get_result(conn) {
            Ok(token) => Ok((1, Some(token))),
            // The row the statement wrote a moment ago in this transaction is gone: the
            // server aborted the transaction under it (a Galera node, for a conflicting
            // write from another node, whose reply to the write claimed success).
            Err(diesel::result::Error::NotFound) => Err(aborted_under_write()),
            Err(other) => Err(other),
        },
        rows => Ok((rows, None)),
    };
    // Inside a transaction the library opened, the two already go or stay together; a
    // savepoint would only add a statement a cluster's abort can fail in (see `nested`).
    if own && crate::write::executor::in_transaction(conn) {
        return write_then_read(conn);
    }
    crate::connect::transaction::nested(conn, write_then_read)
}

/// The next token is version column `Col` as the statement advanced it: `... RETURNING
/// <Col>` on PostgreSQL and SQLite; on MySQL, which has no `RETURNING`, the statement
/// notes the version in the session's `LAST_INSERT_ID` and one `SELECT` reads it and puts
/// the caller's last insert id back ([`NoteVersion`](crate::sql::statement::NoteVersion)).
/// Two round trips and no transaction, where reading the row back takes four (`BEGIN`,
/// the statement, the read, `COMMIT`): the session's own value cannot be changed by
/// another writer.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReturnedVersion<Col>(PhantomData<Col>);

impl<C, S, Col, Tok> Complete<C, S, Tok> for ReturnedVersion<Col>
where
    C: Connection,
    C::Backend: ReadsVersionBack<C, S, Col, Tok>,
{
    fn run(conn: &mut C, statement: S, own: bool) -> QueryResult<(usize, Option<Tok>)> {
        <C::Backend as ReadsVersionBack<C, S, Col, Tok>>::run(conn, statement, own)
    }
}

/// How backend `Self` runs `statement` and reads back the version it left in `Col`.
#[diagnostic::on_unimplemented(
    message = "this version guard cannot read its new version back on `{Self}`",
    note = "the statement, its guard's assignments or the version's column type do not fit this connection's backend"
)]
pub trait ReadsVersionBack<C, S, Col, Tok> {
    /// Runs `statement` on `conn`: the rows it matched and the version it left.
    fn run(conn: &mut C, statement: S, own: bool) -> QueryResult<(usize, Option<Tok>)>;
}

/// `RETURNING`, as any other column read back.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
macro_rules! reads_version_by_returning {
    ($backend:ty) => {
        impl<C, S, Col, Tok> ReadsVersionBack<C, S, Col, Tok> for $backend
        where
            C: Connection<Backend = Self>,
            Returning<S, Col>: diesel::query_dsl::LoadQuery<'static, C, Tok>,
        {
            fn run(conn: &mut C, statement: S, _own: bool) -> QueryResult<(usize, Option<Tok>)> {
                load_returning::<C, S, Col, Tok>(conn, statement)
            }
        }
    };
}

#[cfg(feature = "postgres")]
reads_version_by_returning!(diesel::pg::Pg);
#[cfg(feature = "sqlite")]
reads_version_by_returning!(diesel::sqlite::Sqlite);

/// The statement noting its version, then the read of the note (skipped when it wrote
/// nothing: then nothing was noted and the caller's value was never touched).
#[cfg(feature = "mysql")]
impl<C, T, Changes, Advance, Key, Guard, Col, Tok>
    ReadsVersionBack<
        C,
        crate::sql::statement::GuardedUpdate<T, Changes, Advance, Key, Guard>,
        Col,
        Tok,
    > for diesel::mysql::Mysql
where
    C: Connection<Backend = Self> + diesel::connection::LoadConnection,
    T: diesel::Table,
    Tok: crate::guard::version::VersionNumber,
    crate::sql::statement::NotingVersion<T, Changes, Advance, Key, Guard, Col>: ExecuteDsl<C>,
{
    fn run(
        conn: &mut C,
        statement: crate::sql::statement::GuardedUpdate<T, Changes, Advance, Key, Guard>,
        _own: bool,
    ) -> QueryResult<(usize, Option<Tok>)> {
        use crate::sql::statement::{NotedVersion, ReadNotedVersion};
        match ExecuteDsl::execute(statement.noting_version::<Col>(), conn)? {
            0 => Ok((0, None)),
            1 => {
                let noted: NotedVersion = ReadNotedVersion.get_result(conn)?;
                Ok((1, Some(noted.version()?)))
            }
            // A key of several rows (the write is then refused): restore the caller's value too.
            rows => ReadNotedVersion
                .get_result::<NotedVersion>(conn)
                .map(|_| (rows, None)),
        }
    }
}

/// The next token is column `Col` as the database left it after the statement and its
/// triggers (a token other code maintains): `RETURNING` on PostgreSQL, where a `BEFORE`
/// trigger's value is the returned one; on SQLite, whose `RETURNING` reports the values
/// before its triggers ran, and on MySQL, the statement and a read of the column in one
/// transaction.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadAfter<Col>(PhantomData<Col>);

impl<C, S, Col, Tok> Complete<C, S, Tok> for ReadAfter<Col>
where
    C: Connection,
    C::Backend: ReadsAfterTriggers<C, S, Col, Tok>,
{
    fn run(conn: &mut C, statement: S, own: bool) -> QueryResult<(usize, Option<Tok>)> {
        <C::Backend as ReadsAfterTriggers<C, S, Col, Tok>>::run(conn, statement, own)
    }
}

/// How backend `Self` runs `statement` and reads the column `Col` as the statement's
/// triggers left it.
#[diagnostic::on_unimplemented(
    message = "this guard cannot read the token its triggers set back on `{Self}`",
    note = "a `row_version` token is read back after updates the library builds; this write is not one of them"
)]
pub trait ReadsAfterTriggers<C, S, Col, Tok> {
    /// Runs `statement` on `conn`: the rows it matched and the token the row then holds.
    fn run(conn: &mut C, statement: S, own: bool) -> QueryResult<(usize, Option<Tok>)>;
}

#[cfg(feature = "postgres")]
impl<C, S, Col, Tok> ReadsAfterTriggers<C, S, Col, Tok> for diesel::pg::Pg
where
    C: Connection<Backend = Self>,
    Returning<S, Col>: diesel::query_dsl::LoadQuery<'static, C, Tok>,
{
    fn run(conn: &mut C, statement: S, _own: bool) -> QueryResult<(usize, Option<Tok>)> {
        load_returning::<C, S, Col, Tok>(conn, statement)
    }
}

/// Implements [`ReadsAfterTriggers`] for a backend whose `RETURNING` cannot see what
/// triggers set: the statement, then a read, in one transaction.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
macro_rules! reads_after_triggers_by_reading {
    ($backend:ty) => {
        impl<C, T, Changes, Advance, Key, Guard, Col, Tok>
            ReadsAfterTriggers<
                C,
                crate::sql::statement::GuardedUpdate<T, Changes, Advance, Key, Guard>,
                Col,
                Tok,
            > for $backend
        where
            C: Connection<Backend = Self>,
            T: diesel::Table,
            T::FromClause: Clone,
            Key: Clone,
            crate::sql::statement::GuardedUpdate<T, Changes, Advance, Key, Guard>: ExecuteDsl<C>,
            crate::sql::statement::ColumnOfRow<T, Key, Col>:
                diesel::query_dsl::LoadQuery<'static, C, Tok>,
        {
            fn run(
                conn: &mut C,
                statement: crate::sql::statement::GuardedUpdate<T, Changes, Advance, Key, Guard>,
                own: bool,
            ) -> QueryResult<(usize, Option<Tok>)> {
                execute_then_read::<C, T, Changes, Advance, Key, Guard, Col, Tok>(
                    conn, statement, own,
                )
            }
        }
    };
}

#[cfg(feature = "mysql")]
reads_after_triggers_by_reading!(diesel::mysql::Mysql);
#[cfg(feature = "sqlite")]
reads_after_triggers_by_reading!(diesel::sqlite::Sqlite);

/// Runs guarded statements of distinct rows in as few statements as the backend allows
/// ([`ValuesUpdate`]): the index of each statement that wrote its row and, for kinds
/// whose next token only the database knows, that token.
pub trait CompleteEach<C, S, Tok> {
    /// Runs `updates` on `conn`; they must not share a key.
    fn run_each(conn: &mut C, updates: Vec<S>) -> QueryResult<Vec<(usize, Option<Tok>)>>;
}

impl<C, S, Tok> CompleteEach<C, S, Tok> for Counted
where
    C: Connection,
    C::Backend: OccBackend,
    S: QueryFragment<C::Backend> + Template<C::Backend>,
    ValuesUpdate<S, RowOnly>: diesel::query_dsl::LoadQuery<'static, C, i32>,
{
    fn run_each(conn: &mut C, updates: Vec<S>) -> QueryResult<Vec<(usize, Option<Tok>)>> {
        let mut written = Vec::new();
        for statement in ValuesUpdate::<S, RowOnly>::group::<C::Backend>(updates)? {
            let rows: Vec<i32> = statement.load(conn)?;
            written.extend(rows.into_iter().map(|row| (row as usize, None)));
        }
        Ok(written)
    }
}

/// Several statements in one: only PostgreSQL combines them, and its `RETURNING` sees
/// what `BEFORE` triggers set.
impl<C, S, Col, Tok> CompleteEach<C, S, Tok> for ReadAfter<Col>
where
    C: Connection,
    C::Backend: OccBackend,
    Col: Column,
    S: QueryFragment<C::Backend> + Template<C::Backend>,
    ValuesUpdate<S, RowAndToken<Col>>: diesel::query_dsl::LoadQuery<'static, C, (i32, Tok)>,
{
    fn run_each(conn: &mut C, updates: Vec<S>) -> QueryResult<Vec<(usize, Option<Tok>)>> {
        ReturnedBy::<Col>::run_each(conn, updates)
    }
}

impl<C, S, Col, Tok> CompleteEach<C, S, Tok> for ReturnedBy<Col>
where
    C: Connection,
    C::Backend: OccBackend,
    Col: Column,
    S: QueryFragment<C::Backend> + Template<C::Backend>,
    ValuesUpdate<S, RowAndToken<Col>>: diesel::query_dsl::LoadQuery<'static, C, (i32, Tok)>,
{
    fn run_each(conn: &mut C, updates: Vec<S>) -> QueryResult<Vec<(usize, Option<Tok>)>> {
        let mut written = Vec::new();
        for statement in ValuesUpdate::<S, RowAndToken<Col>>::group::<C::Backend>(updates)? {
            let rows: Vec<(i32, Tok)> = statement.load(conn)?;
            written.extend(
                rows.into_iter()
                    .map(|(row, token)| (row as usize, Some(token))),
            );
        }
        Ok(written)
    }
}

/// `<statement> RETURNING <Col>`.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
#[derive(Debug, Clone)]
pub struct Returning<S, Col> {
    statement: S,
    column: PhantomData<Col>,
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
impl<S, Col> Returning<S, Col> {
    /// `statement RETURNING <Col>`.
    pub(crate) fn new(statement: S) -> Self {
        Returning {
            statement,
            column: PhantomData,
        }
    }
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
impl<S, Col: Column> Query for Returning<S, Col> {
    type SqlType = Col::SqlType;
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
impl<S, Col, DB> QueryFragment<DB> for Returning<S, Col>
where
    DB: Backend,
    S: QueryFragment<DB>,
    Col: Column,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        self.statement.walk_ast(out.reborrow())?;
        out.push_sql(" RETURNING ");
        out.push_identifier(Col::NAME)
    }
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
impl<S, Col> QueryId for Returning<S, Col> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
impl<S, Col, Conn> RunQueryDsl<Conn> for Returning<S, Col> {}
