//! The last-modified guard on the database's clock:
//! `#[occ(last_modified(clock = database))]`.
//!
//! The callers' clocks may disagree. With this clock, the next timestamp comes from the
//! server, `GREATEST(now cut to the precision, old + one tick)`, so it still always moves
//! on. The same statement hands it back with `RETURNING`: no second query. PostgreSQL only
//! (`clock_timestamp()`, which, unlike `now()`, is not frozen at the transaction's start).
//! MySQL has no `RETURNING`, and SQLite's clock keeps milliseconds in a text form other
//! than diesel's, so on those backends such an entity's writes do not compile; use the
//! application's clock there.

use std::marker::PhantomData;

use diesel::pg::Pg;
use diesel::query_builder::{AstPass, QueryFragment};
use diesel::serialize::ToSql;
use diesel::sql_types::is_nullable::NotNull;
use diesel::sql_types::SqlType;
use diesel::{Column, QueryResult};

use crate::completion::ReturnedBy;
use crate::error::Token;
use crate::guard::{Advancing, GuardKind};
use crate::last_modified::{Precision, Timestamp};
use crate::statement::ColumnEq;

/// `"col" = GREATEST(date_trunc(unit, now), date_trunc(unit, ?old) + interval '1 unit')`.
#[derive(Debug, Clone, Copy)]
pub struct DatabaseNow<Col, Ts, P> {
    old: Ts,
    column: PhantomData<(Col, P)>,
}

impl<Col, Ts, P> QueryFragment<Pg> for DatabaseNow<Col, Ts, P>
where
    Col: Column,
    Ts: Timestamp + ToSql<Col::SqlType, Pg>,
    P: Precision,
    Pg: diesel::sql_types::HasSqlType<Col::SqlType>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_identifier(Col::NAME)?;
        out.push_sql(" = GREATEST(date_trunc('");
        out.push_sql(P::UNIT);
        out.push_sql("', ");
        out.push_sql(Ts::POSTGRES_NOW);
        out.push_sql("), date_trunc('");
        out.push_sql(P::UNIT);
        out.push_sql("', ");
        out.push_bind_param::<Col::SqlType, Ts>(&self.old)?;
        out.push_sql(") + interval '1 ");
        out.push_sql(P::UNIT);
        out.push_sql("')");
        Ok(())
    }
}

/// The last-modified guard on column `Col` read as `Ts`, stamped by the database's clock
/// at precision `P`.
pub struct DatabaseClockGuard<Col, Ts, P>(PhantomData<(Col, Ts, P)>);

impl<Col, Ts, P> GuardKind for DatabaseClockGuard<Col, Ts, P>
where
    Col: Column,
    Col::SqlType: SqlType<IsNull = NotNull>,
    Ts: Timestamp,
    P: Precision,
{
    type Token = Ts;
    type Predicate = ColumnEq<Col, Ts>;
    type Advance = DatabaseNow<Col, Ts, P>;
    type Completion = ReturnedBy<Col>;

    fn predicate(token: &Ts) -> Self::Predicate {
        ColumnEq::new(*token)
    }

    /// The server computes the next timestamp; the statement returns it.
    fn advance(token: &Ts) -> Option<(Self::Advance, Ts)> {
        let advance = DatabaseNow {
            old: *token,
            column: PhantomData,
        };
        Some((advance, *token))
    }

    fn describe(token: &Ts) -> Token {
        Token::Timestamp(
            token
                .to_utc()
                .format("%Y-%m-%d %H:%M:%S%.6f UTC")
                .to_string(),
        )
    }
}

impl<Col, Ts, P> Advancing for DatabaseClockGuard<Col, Ts, P> where Self: GuardKind {}
