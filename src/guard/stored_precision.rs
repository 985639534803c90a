//! A time token must be stored exactly as computed. PostgreSQL rounds a
//! `10:00:00.700123` written to a `timestamp(0)` column to `10:00:01` and MariaDB cuts it
//! for a `DATETIME`: the writer's next write with the token it was handed is a conflict
//! with itself, and a write within one second of the last (one tick past it, rounded
//! back) does not move the token at all, so a stale copy would still match. So before
//! the first write of each entity with a time token, the column's declared fractional
//! digits are read once (`information_schema.columns`) and compared with the guard's
//! precision; a column that keeps fewer is refused, naming the attribute that makes the
//! two agree. SQLite's text columns keep what is written and need no check.

use std::any::TypeId;
use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

use crate::error::Error;
use crate::guard::{GuardKind, Guarded};

/// A time token's column whose declared digits have not been read yet in this process.
pub(crate) struct PrecisionCheck {
    entity: (TypeId, &'static str),
    table: &'static str,
    column: &'static str,
    token_digits: u32,
}

/// The entities (and backends) whose columns kept every digit of their tokens where they
/// were first read: a quick, precise refusal before the first write. It is not the
/// guarantee, since one type may be written on several schemas or databases: every
/// write that compares a time token also checks its column (`TimeTokenHeld`).
fn passed() -> &'static Mutex<HashSet<(TypeId, &'static str)>> {
    static PASSED: OnceLock<Mutex<HashSet<(TypeId, &'static str)>>> = OnceLock::new();
    PASSED.get_or_init(Mutex::default)
}

impl PrecisionCheck {
    /// The check entity `T` (of `table`) still needs on backend `DB`, or `None`: a token
    /// without time digits, or a column already read.
    pub(crate) fn of<T: Guarded, DB>(table: &'static str) -> Option<Self> {
        let check = Self::again::<T, DB>(table)?;
        let passed = passed()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&check.entity);
        (!passed).then_some(check)
    }

    /// The check of entity `T` on backend `DB` whether or not it passed before (`None`: a
    /// token without time digits). A write that compared a time token and matched nothing
    /// while the row holds that token may have met a column that keeps fewer digits where
    /// this connection resolves the table (another schema or database than the one that
    /// passed): this reads it there.
    pub(crate) fn again<T: Guarded, DB>(table: &'static str) -> Option<Self> {
        let token_digits = T::Guard::TOKEN_DIGITS?;
        let entity = (TypeId::of::<T>(), std::any::type_name::<DB>());
        Some(PrecisionCheck {
            entity,
            table,
            column: T::GUARD_COLUMNS.first().copied().unwrap_or_default(),
            token_digits,
        })
    }

    /// The schema (if the table names one), table and column to read the digits of.
    pub(crate) fn column(&self) -> (Option<&'static str>, &'static str, &'static str) {
        match self.table.rsplit_once('.') {
            Some((schema, name)) => (Some(schema), name, self.column),
            None => (None, self.table, self.column),
        }
    }

    /// Judges the digits the column declares (`None`: it does not say): fewer than the
    /// token carries is [`Error::SchemaMismatch`]; otherwise the entity passes for good.
    pub(crate) fn judge(self, stored: Option<u32>) -> Result<(), Error> {
        let token_digits = self.token_digits;
        if let Some(stored) = stored.filter(|stored| *stored < token_digits) {
            let fits = if stored >= 3 {
                "`#[occ(last_modified(precision = \"millis\"))]`"
            } else {
                "`#[occ(last_modified(precision = \"seconds\"))]`"
            };
            return Err(Error::SchemaMismatch {
                table: self.table,
                column: self.column.to_string(),
                reason: format!(
                    "the column keeps {stored} fractional digits of a second and the guard's \
                     tokens carry {token_digits}, so the database would round or cut each new \
                     token and the writer's own next write would conflict with it; add {fits} \
                     to the field, or declare the column with {token_digits} digits"
                ),
            });
        }
        passed()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(self.entity);
        Ok(())
    }
}

/// How a backend tests, inside a guarded write, that the token's column keeps `digits`
/// fractional digits of a second. The check above is read once per entity type and is
/// the early, precise refusal; this one travels with every write that compares a time
/// token, wherever the table resolves (another schema on the search path, another
/// database), so a column that keeps fewer digits makes the write match nothing instead
/// of storing a token rounded back onto the old one. The miss is then explained by the
/// check above, read again.
#[cfg(feature = "chrono")]
pub trait StoredDigits: diesel::backend::Backend {
    /// Pushes ` AND <column keeps digits>` for column `Col`, or nothing where every digit
    /// is kept (SQLite stores the text written).
    fn push_keeps_digits<Col: diesel::Column>(
        out: &mut diesel::query_builder::AstPass<'_, '_, Self>,
        digits: u32,
    ) -> diesel::QueryResult<()>;
}

/// PostgreSQL: the column's type modifier in the catalog, found through the row's own
/// `tableoid` (the table the statement resolved, not a name looked up again; read from a
/// derived table, which has no `tableoid` of its own to shadow the row's). An index
/// lookup in the system cache, about 3 µs a statement. -1 is a type without declared
/// digits (6).
#[cfg(all(feature = "chrono", feature = "postgres"))]
impl StoredDigits for diesel::pg::Pg {
    fn push_keeps_digits<Col: diesel::Column>(
        out: &mut diesel::query_builder::AstPass<'_, '_, Self>,
        digits: u32,
    ) -> diesel::QueryResult<()> {
        if digits == 0 {
            return Ok(());
        }
        out.push_sql(&format!(
            " AND EXISTS (SELECT FROM (SELECT a.atttypmod AS digits, a.attrelid AS relation \
             FROM pg_catalog.pg_attribute a WHERE a.attname = '{}') occ_column \
             WHERE occ_column.relation = tableoid AND occ_column.digits NOT BETWEEN 0 AND {})",
            Col::NAME.replace('\'', "''"),
            digits - 1
        ));
        Ok(())
    }
}

/// MySQL / MariaDB: a time value turned into text carries exactly its column's digits
/// (`2026-01-01 10:00:00` for `DATETIME`, 26 characters for `DATETIME(6)`). Reading
/// `information_schema` in the statement instead costs about 220 µs a write on MariaDB.
#[cfg(all(feature = "chrono", feature = "mysql"))]
impl StoredDigits for diesel::mysql::Mysql {
    fn push_keeps_digits<Col: diesel::Column>(
        out: &mut diesel::query_builder::AstPass<'_, '_, Self>,
        digits: u32,
    ) -> diesel::QueryResult<()> {
        if digits == 0 {
            return Ok(());
        }
        out.push_sql(" AND CHAR_LENGTH(CAST(");
        out.push_identifier(Col::NAME)?;
        out.push_sql(&format!(" AS CHAR)) >= {}", 20 + digits));
        Ok(())
    }
}

#[cfg(all(feature = "chrono", feature = "sqlite"))]
impl StoredDigits for diesel::sqlite::Sqlite {
    fn push_keeps_digits<Col: diesel::Column>(
        _: &mut diesel::query_builder::AstPass<'_, '_, Self>,
        _: u32,
    ) -> diesel::QueryResult<()> {
        Ok(())
    }
}

/// `"col" = ?token`, and that the column keeps `P`'s digits ([`StoredDigits`]): the
/// predicate of both last-modified guards.
#[cfg(feature = "chrono")]
#[derive(Debug, Clone, Copy)]
pub struct TimeTokenHeld<Col, Ts, P> {
    held: crate::sql::statement::ColumnEq<Col, Ts>,
    precision: std::marker::PhantomData<P>,
}

#[cfg(feature = "chrono")]
impl<Col, Ts, P> TimeTokenHeld<Col, Ts, P> {
    /// The row holds `token`.
    pub(crate) fn new(token: Ts) -> Self {
        TimeTokenHeld {
            held: crate::sql::statement::ColumnEq::new(token),
            precision: std::marker::PhantomData,
        }
    }
}

#[cfg(feature = "chrono")]
impl<Col, Ts, P, DB> diesel::query_builder::QueryFragment<DB> for TimeTokenHeld<Col, Ts, P>
where
    DB: StoredDigits + diesel::sql_types::HasSqlType<Col::SqlType>,
    Col: diesel::Column,
    Ts: diesel::serialize::ToSql<Col::SqlType, DB>,
    P: crate::guard::timestamp::Precision,
{
    fn walk_ast<'b>(
        &'b self,
        mut out: diesel::query_builder::AstPass<'_, 'b, DB>,
    ) -> diesel::QueryResult<()> {
        self.held.walk_ast(out.reborrow())?;
        DB::push_keeps_digits::<Col>(&mut out, P::DIGITS)
    }
}

#[cfg(feature = "chrono")]
impl<Col: 'static, Ts: 'static, P: 'static> diesel::query_builder::QueryId
    for TimeTokenHeld<Col, Ts, P>
{
    type QueryId = Self;
    const HAS_STATIC_QUERY_ID: bool = true;
}
