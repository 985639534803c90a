//! PostgreSQL's `xmin` system column as the token (`#[occ(xmin)]`), no schema change.
//!
//! Every row version PostgreSQL writes carries the id of the transaction that wrote it in
//! `xmin`, so a changed row has a changed `xmin`: `UPDATE ... WHERE <key> AND xmin = ?read
//! RETURNING xmin` proves the row and hands back the new token in the same statement.
//! Declare the column in your `table!` as `xmin -> diesel_occ::Xid` and read it
//! with the rest of the row; never insert it.
//!
//! What it costs and protects: the same as a version column (ABA included, since every
//! write makes a new row version), with no column to add. Within one transaction every
//! write of the row carries that transaction's id, so the token moves between
//! transactions, not between writes of the same one. Transaction ids wrap after
//! about four billion transactions; a copy kept that long could match a much later row,
//! which a version column cannot. `guarded_touch` has nothing to set and is refused.
//! Other backends have no such column: an `#[occ(xmin)]` entity's writes do not compile
//! for them.

use std::io::Write;
use std::marker::PhantomData;

use diesel::deserialize::{self, FromSql};
use diesel::pg::{Pg, PgValue};
use diesel::serialize::{self, IsNull, Output, ToSql};
use diesel::Column;

use crate::error::Token;
use crate::guard::{AdvanceInSql, Advancing, GuardKind};
use crate::sql::new_token::ReturnedBy;
use crate::sql::statement::{ColumnEq, Unguarded};

/// PostgreSQL's `xid`, the type of `xmin`: a 32-bit transaction id, read as `u32`.
#[derive(
    Debug, Clone, Copy, Default, diesel::sql_types::SqlType, diesel::query_builder::QueryId,
)]
#[diesel(postgres_type(oid = 28, array_oid = 1011))]
pub struct Xid;

impl FromSql<Xid, Pg> for u32 {
    fn from_sql(value: PgValue<'_>) -> deserialize::Result<Self> {
        let bytes: [u8; 4] = value
            .as_bytes()
            .try_into()
            .map_err(|_| format!("an xid has 4 bytes, got {}", value.as_bytes().len()))?;
        Ok(u32::from_be_bytes(bytes))
    }
}

impl ToSql<Xid, Pg> for u32 {
    fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Pg>) -> serialize::Result {
        out.write_all(&self.to_be_bytes())?;
        Ok(IsNull::No)
    }
}

/// The `xmin` guard on column `Col` (declared as [`Xid`]).
pub struct XminGuard<Col>(PhantomData<Col>);

impl<Col> GuardKind for XminGuard<Col>
where
    Col: Column<SqlType = Xid>,
{
    type Token = u32;
    type Predicate = ColumnEq<Col, u32>;
    type Advance = Unguarded;
    type Completion = ReturnedBy<Col>;

    fn predicate(token: &u32) -> Self::Predicate {
        ColumnEq::new(*token)
    }

    /// PostgreSQL advances `xmin` itself; the statement returns the new one.
    fn advance(token: &u32) -> Option<(Self::Advance, u32)> {
        Some((Unguarded, *token))
    }

    fn describe(token: &u32) -> Token {
        Token::RowVersion(*token)
    }
}

impl<Col> Advancing for XminGuard<Col> where Self: GuardKind {}

/// PostgreSQL gives every written row a new `xmin`: nothing to assign, no row left out.
impl<Col> AdvanceInSql for XminGuard<Col>
where
    Col: Column<SqlType = Xid>,
{
    type AdvanceAny = Unguarded;
    type CanAdvance = Unguarded;
    type TokenColumn = Col;
    type ReadBack = crate::sql::new_token::ReturnedBy<Col>;

    fn advance_any() -> Unguarded {
        Unguarded
    }

    fn can_advance() -> Unguarded {
        Unguarded
    }

    fn at_end(_: &u32) -> bool {
        false
    }
}
