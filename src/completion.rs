//! How a guarded statement runs, and how the writer learns the row's new token.
//!
//! Most guard kinds compute the next token before sending (a version, a timestamp), so
//! the statement is executed and its rows counted ([`Counted`]). A token only the
//! database knows (PostgreSQL's `xmin`) is read back by the statement itself
//! (`... RETURNING <column>`, [`ReturnedBy`]): one round trip either way.

use std::marker::PhantomData;

use diesel::backend::Backend;
use diesel::connection::Connection;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::query_dsl::methods::ExecuteDsl;
use diesel::{Column, QueryResult, RunQueryDsl};

/// Runs a guarded statement on connection `C`: the rows it matched and, for kinds whose
/// next token only the database knows, that token.
#[diagnostic::on_unimplemented(
    message = "this guard cannot run its statement on `{C}`",
    note = "an `xmin` guard and a last-modified guard on the database's clock read the new token back with `RETURNING`, which diesel-occ offers on PostgreSQL only"
)]
pub trait Complete<C, S, Tok> {
    /// Runs `statement` on `conn`.
    fn run(conn: &mut C, statement: S) -> QueryResult<(usize, Option<Tok>)>;
}

/// The next token was computed before sending: execute and count.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counted;

impl<C, S, Tok> Complete<C, S, Tok> for Counted
where
    C: Connection,
    S: ExecuteDsl<C>,
{
    fn run(conn: &mut C, statement: S) -> QueryResult<(usize, Option<Tok>)> {
        ExecuteDsl::execute(statement, conn).map(|rows| (rows, None))
    }
}

/// The next token is column `Col` as the statement left it: `... RETURNING <Col>`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReturnedBy<Col>(PhantomData<Col>);

#[cfg(feature = "postgres")]
impl<C, S, Col, Tok> Complete<C, S, Tok> for ReturnedBy<Col>
where
    C: diesel::connection::LoadConnection<Backend = diesel::pg::Pg>,
    Col: Column,
    Returning<S, Col>: diesel::query_dsl::LoadQuery<'static, C, Tok>,
{
    fn run(conn: &mut C, statement: S) -> QueryResult<(usize, Option<Tok>)> {
        let tokens: Vec<Tok> = Returning {
            statement,
            column: PhantomData,
        }
        .load(conn)?;
        Ok((tokens.len(), tokens.into_iter().next()))
    }
}

/// `<statement> RETURNING <Col>`.
#[derive(Debug, Clone)]
pub struct Returning<S, Col> {
    statement: S,
    column: PhantomData<Col>,
}

impl<S, Col: Column> Query for Returning<S, Col> {
    type SqlType = Col::SqlType;
}

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

impl<S, Col> QueryId for Returning<S, Col> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<S, Col, Conn> RunQueryDsl<Conn> for Returning<S, Col> {}
