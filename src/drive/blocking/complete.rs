//! The blocking driver of a guarded statement: it sends the backend's plan for learning
//! the row's new token ([`TokenPlan`]) and answers the rows matched and the token.

use diesel::connection::Connection;
use diesel::query_builder::QueryFragment;
use diesel::query_dsl::methods::ExecuteDsl;
use diesel::{Column, QueryResult, RunQueryDsl};

use crate::connect::backend::OccBackend;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
use crate::flow::read_back::returned;
#[cfg(any(feature = "mysql", feature = "sqlite"))]
use crate::flow::read_back::ReadBack;
#[cfg(feature = "mysql")]
use crate::sql::new_token::NotedThenRead;
#[cfg(any(feature = "mysql", feature = "sqlite"))]
use crate::sql::new_token::ReadAfterWrite;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
use crate::sql::new_token::Returning;
use crate::sql::new_token::{Counted, Executed, ReadAfter, ReturnedBy, TokenPlan};
use crate::sql::values_update::{RowAndToken, RowOnly, Template, ValuesUpdate};

/// Runs a guarded statement on connection `C`: the rows it matched and, for kinds whose
/// next token only the database knows, that token. The blocking driver of [`TokenPlan`].
#[diagnostic::on_unimplemented(
    message = "this guard cannot run its statement on `{C}`",
    note = "the statement, its guard's assignments or the token's column type do not fit this connection's backend"
)]
pub trait Complete<C, S, Tok> {
    /// Runs `statement` on `conn`; `own`: whether `conn`'s open transaction, if any, is
    /// the library's.
    fn run(conn: &mut C, statement: S, own: bool) -> QueryResult<(usize, Option<Tok>)>;
}

impl<C, S, Tok, K> Complete<C, S, Tok> for K
where
    C: Connection,
    K: TokenPlan<C::Backend, S, Tok>,
    K::Plan: SendPlan<C, Tok>,
{
    fn run(conn: &mut C, statement: S, own: bool) -> QueryResult<(usize, Option<Tok>)> {
        K::plan(statement).send(conn, own)
    }
}

/// How the blocking driver sends a plan of [`TokenPlan`] on connection `C`.
#[diagnostic::on_unimplemented(
    message = "this guard's statements cannot be sent on `{C}`",
    note = "the statement, its guard's assignments or the token's column type do not fit this connection's backend"
)]
pub trait SendPlan<C, Tok> {
    /// Sends the plan on `conn`: the rows the statement matched and the token it left.
    #[doc(hidden)]
    fn send(self, conn: &mut C, own: bool) -> QueryResult<(usize, Option<Tok>)>;
}

impl<C, S, Tok> SendPlan<C, Tok> for Executed<S>
where
    C: Connection,
    S: ExecuteDsl<C>,
{
    fn send(self, conn: &mut C, _own: bool) -> QueryResult<(usize, Option<Tok>)> {
        ExecuteDsl::execute(self.0, conn).map(|rows| (rows, None))
    }
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
impl<C, S, Col, Tok> SendPlan<C, Tok> for Returning<S, Col>
where
    Returning<S, Col>: diesel::query_dsl::LoadQuery<'static, C, Tok>,
{
    fn send(self, conn: &mut C, _own: bool) -> QueryResult<(usize, Option<Tok>)> {
        Ok(returned(self.load(conn)?))
    }
}

#[cfg(any(feature = "mysql", feature = "sqlite"))]
impl<C, S, R, Tok> SendPlan<C, Tok> for ReadAfterWrite<S, R>
where
    C: Connection,
    S: ExecuteDsl<C>,
    R: diesel::query_dsl::LoadQuery<'static, C, Tok>,
{
    fn send(self, conn: &mut C, own: bool) -> QueryResult<(usize, Option<Tok>)> {
        let ReadAfterWrite { write, read } = self;
        let read_back =
            ReadBack::after_write(own, crate::connect::transaction::in_transaction(conn));
        let write_then_read = |conn: &mut C| {
            let rows = ExecuteDsl::execute(write, conn)?;
            match read_back.written(rows) {
                true => read_back.read(read.get_result(conn)),
                false => Ok((rows, None)),
            }
        };
        if read_back.nests() {
            crate::connect::transaction::nested(conn, write_then_read)
        } else {
            write_then_read(conn)
        }
    }
}

#[cfg(feature = "mysql")]
impl<C, S, Tok> SendPlan<C, Tok> for NotedThenRead<S>
where
    C: Connection<Backend = diesel::mysql::Mysql> + diesel::connection::LoadConnection,
    S: ExecuteDsl<C>,
    Tok: crate::guard::version::VersionNumber,
{
    fn send(self, conn: &mut C, _own: bool) -> QueryResult<(usize, Option<Tok>)> {
        use crate::sql::statement::{NotedVersion, ReadNotedVersion};
        let rows = ExecuteDsl::execute(self.0, conn)?;
        if !ReadBack::NOTE.written(rows) {
            return Ok((rows, None));
        }
        ReadBack::note(rows, ReadNotedVersion.get_result::<NotedVersion>(conn))
    }
}

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
