//! A token the database maintains: `#[occ(row_version)]`.
//!
//! For tables other code owns, or whose token a trigger, an `ON UPDATE CURRENT_TIMESTAMP`
//! column or a SQL Server-style `rowversion` keeps: the library compares the column by
//! value (`WHERE ... AND row_version = ?read`), never assigns it, and learns the value
//! the write left (`RETURNING` on PostgreSQL, where a `BEFORE` trigger sets it; on SQLite,
//! whose `RETURNING` reports values from before its triggers, and on MySQL, a read of the
//! column in the same transaction). The token can be bytes (`BLOB`, `BYTEA`,
//! `BINARY(n)`), a number, text or a timestamp.
//!
//! The protection is the trigger's: a write that does not change the column leaves
//! copies read before it able to write. MySQL's `ON UPDATE CURRENT_TIMESTAMP` moves only
//! when another value changes, and a `NOW()` trigger on PostgreSQL gives every write of
//! one transaction the same stamp, so a counter or a clock with enough digits is the
//! safer trigger. `guarded_touch` has nothing to set; `guarded_insert` is left to the
//! database's default (insert such rows with diesel).

use std::fmt::Debug;
use std::marker::PhantomData;

use diesel::Column;

use crate::error::Token;
use crate::guard::{AdvanceInSql, Advancing, GuardKind};
use crate::sql::new_token::ReadAfter;
use crate::sql::statement::{ColumnEq, Unguarded};

/// A value the database keeps in a `row_version` column: compared by value, shown in
/// conflicts.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a `row_version` token",
    note = "a row version is `Vec<u8>` (BLOB, BYTEA, BINARY(n)), `i64`, `i32`, `String`, or a chrono timestamp, in a NOT NULL column"
)]
pub trait RowVersionValue: Clone + Debug + PartialEq + Send + Sync + 'static {
    /// The value as conflicts and messages show it.
    fn show(&self) -> String;
}

impl RowVersionValue for Vec<u8> {
    /// Hexadecimal, as databases print binary values.
    fn show(&self) -> String {
        let hex: String = self.iter().map(|byte| format!("{byte:02x}")).collect();
        format!("0x{hex}")
    }
}

/// Numbers, text and timestamps show as written.
macro_rules! shown_by_debug {
    ($($ty:ty),*) => {
        $(impl RowVersionValue for $ty {
            fn show(&self) -> String {
                format!("{self:?}")
            }
        })*
    };
}

shown_by_debug!(i32, i64, String);
#[cfg(feature = "chrono")]
shown_by_debug!(chrono::NaiveDateTime, chrono::DateTime<chrono::Utc>);

/// The guard on column `Col`, whose value `Tok` the database sets on every write.
pub struct RowVersionGuard<Col, Tok>(PhantomData<(Col, Tok)>);

impl<Col, Tok> GuardKind for RowVersionGuard<Col, Tok>
where
    Col: Column,
    Tok: RowVersionValue,
{
    type Token = Tok;
    type Predicate = ColumnEq<Col, Tok>;
    type Advance = Unguarded;
    type Completion = ReadAfter<Col>;

    fn predicate(token: &Tok) -> Self::Predicate {
        ColumnEq::new(token.clone())
    }

    /// The database moves the token; the write reads the new one back.
    fn advance(token: &Tok) -> Option<(Self::Advance, Tok)> {
        Some((Unguarded, token.clone()))
    }

    fn describe(token: &Tok) -> Token {
        Token::RowValue(token.show())
    }
}

impl<Col, Tok> Advancing for RowVersionGuard<Col, Tok> where Self: GuardKind {}

/// The database moves the token of every row it writes: nothing to assign, no row left
/// out.
impl<Col, Tok> AdvanceInSql for RowVersionGuard<Col, Tok>
where
    Col: Column,
    Tok: RowVersionValue,
{
    type AdvanceAny = Unguarded;
    type CanAdvance = Unguarded;
    type TokenColumn = Col;
    type ReadBack = ReadAfter<Col>;

    fn advance_any() -> Unguarded {
        Unguarded
    }

    fn can_advance() -> Unguarded {
        Unguarded
    }

    fn at_end(_: &Tok) -> bool {
        false
    }
}
