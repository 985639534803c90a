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
#[cfg(any(feature = "postgres", feature = "sqlite"))]
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
#[cfg(any(feature = "postgres", feature = "sqlite"))]
use diesel::{Column, QueryResult, RunQueryDsl};

#[cfg(any(feature = "mysql", feature = "sqlite"))]
use crate::sql::statement::{ColumnOfRow, GuardedUpdate};

/// How backend `DB` learns the next token of statement `S` for the completion kind `Self`
/// (a guard's completion or read-back): what is sent, as a
/// plan both drivers send the same way. Each backend's choice is made here, once.
#[diagnostic::on_unimplemented(
    message = "this guard cannot learn its new token on `{DB}`",
    note = "an `xmin` guard is PostgreSQL's; a `row_version` token is read back after updates the library builds; otherwise the statement, its guard's assignments or the token's column type do not fit this backend"
)]
pub trait TokenPlan<DB, S, Tok> {
    /// The statements sent, and how their answers give the rows and the token.
    type Plan;
    /// The plan for `statement`.
    #[doc(hidden)]
    fn plan(statement: S) -> Self::Plan;
}

/// The next token was computed before sending: execute and count.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counted;

/// The next token is column `Col` as the statement left it: `... RETURNING <Col>` on
/// PostgreSQL and SQLite; on MySQL, which has no `RETURNING`, the statement and a read of
/// the column in one transaction ([`ReadAfterWrite`]).
#[derive(Debug, Clone, Copy, Default)]
#[allow(unreachable_pub)] // reached through the guards of features `chrono` and `postgres`
pub struct ReturnedBy<Col>(PhantomData<Col>);

/// The next token is version column `Col` as the statement advanced it: `... RETURNING
/// <Col>` on PostgreSQL and SQLite; on MySQL, which has no `RETURNING`, the statement
/// notes the version in the session's `LAST_INSERT_ID` and one `SELECT` reads it and puts
/// the caller's last insert id back ([`NotedThenRead`]). Two round trips and no
/// transaction, where reading the row back takes four (`BEGIN`, the statement, the read,
/// `COMMIT`): the session's own value cannot be changed by another writer.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReturnedVersion<Col>(PhantomData<Col>);

/// The next token is column `Col` as the database left it after the statement and its
/// triggers (a token other code maintains): `RETURNING` on PostgreSQL, where a `BEFORE`
/// trigger's value is the returned one; on SQLite, whose `RETURNING` reports the values
/// before its triggers ran, and on MySQL, the statement and a read of the column in one
/// transaction.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadAfter<Col>(PhantomData<Col>);

/// Execute the statement and count the rows it matched.
#[doc(hidden)]
#[derive(Debug)]
pub struct Executed<S>(pub(crate) S);

/// The statement, then the read of the column it set (`read`), in one transaction (a
/// savepoint inside the caller's) so that no other writer's value comes between; the
/// row stays locked by the write.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
#[doc(hidden)]
#[derive(Debug)]
pub struct ReadAfterWrite<S, R> {
    pub(crate) write: S,
    pub(crate) read: R,
}

/// MySQL: the statement noting the version it set in the session, then the read of the
/// note, which also restores the caller's last insert id.
#[cfg(feature = "mysql")]
#[doc(hidden)]
#[derive(Debug)]
#[allow(unreachable_pub)] // reached through the version guard on MySQL
pub struct NotedThenRead<S>(pub(crate) S);

impl<DB, S, Tok> TokenPlan<DB, S, Tok> for Counted {
    type Plan = Executed<S>;
    fn plan(statement: S) -> Self::Plan {
        Executed(statement)
    }
}

/// Implements [`TokenPlan`] for completion kind `$kind` on `$backend` by `RETURNING`.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
macro_rules! planned_by_returning {
    ($kind:ident, $backend:ty) => {
        impl<S, Col, Tok> TokenPlan<$backend, S, Tok> for $kind<Col> {
            type Plan = Returning<S, Col>;
            fn plan(statement: S) -> Self::Plan {
                Returning::new(statement)
            }
        }
    };
}

/// Implements [`TokenPlan`] for completion kind `$kind` on `$backend` by the statement
/// and a read of the column in one transaction.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
macro_rules! planned_by_reading {
    ($kind:ident, $backend:ty) => {
        impl<T, Changes, Advance, Key, Guard, Col, Tok>
            TokenPlan<$backend, GuardedUpdate<T, Changes, Advance, Key, Guard>, Tok> for $kind<Col>
        where
            T: diesel::Table,
            T::FromClause: Clone,
            Key: Clone,
        {
            type Plan = ReadAfterWrite<
                GuardedUpdate<T, Changes, Advance, Key, Guard>,
                ColumnOfRow<T, Key, Col>,
            >;
            fn plan(statement: GuardedUpdate<T, Changes, Advance, Key, Guard>) -> Self::Plan {
                let read = statement.read_back::<Col>();
                ReadAfterWrite {
                    write: statement,
                    read,
                }
            }
        }
    };
}

#[cfg(feature = "postgres")]
planned_by_returning!(ReturnedBy, diesel::pg::Pg);
#[cfg(feature = "postgres")]
planned_by_returning!(ReturnedVersion, diesel::pg::Pg);
// PostgreSQL's `RETURNING` sees what `BEFORE` triggers set.
#[cfg(feature = "postgres")]
planned_by_returning!(ReadAfter, diesel::pg::Pg);
#[cfg(feature = "sqlite")]
planned_by_returning!(ReturnedBy, diesel::sqlite::Sqlite);
#[cfg(feature = "sqlite")]
planned_by_returning!(ReturnedVersion, diesel::sqlite::Sqlite);
// SQLite's `RETURNING` reports the values from before its triggers ran.
#[cfg(feature = "sqlite")]
planned_by_reading!(ReadAfter, diesel::sqlite::Sqlite);
#[cfg(feature = "mysql")]
planned_by_reading!(ReturnedBy, diesel::mysql::Mysql);
#[cfg(feature = "mysql")]
planned_by_reading!(ReadAfter, diesel::mysql::Mysql);

/// MySQL's version, noted by the statement in the session.
#[cfg(feature = "mysql")]
impl<T, Changes, Advance, Key, Guard, Col, Tok>
    TokenPlan<diesel::mysql::Mysql, GuardedUpdate<T, Changes, Advance, Key, Guard>, Tok>
    for ReturnedVersion<Col>
where
    T: diesel::Table,
{
    type Plan =
        NotedThenRead<crate::sql::statement::NotingVersion<T, Changes, Advance, Key, Guard, Col>>;
    fn plan(statement: GuardedUpdate<T, Changes, Advance, Key, Guard>) -> Self::Plan {
        NotedThenRead(statement.noting_version::<Col>())
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
