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

/// The entities (and backends) whose columns keep every digit of their tokens.
fn passed() -> &'static Mutex<HashSet<(TypeId, &'static str)>> {
    static PASSED: OnceLock<Mutex<HashSet<(TypeId, &'static str)>>> = OnceLock::new();
    PASSED.get_or_init(Mutex::default)
}

impl PrecisionCheck {
    /// The check entity `T` (of `table`) still needs on backend `DB`, or `None`: a token
    /// without time digits, or a column already read.
    pub(crate) fn of<T: Guarded, DB>(table: &'static str) -> Option<Self> {
        let token_digits = T::Guard::TOKEN_DIGITS?;
        let entity = (TypeId::of::<T>(), std::any::type_name::<DB>());
        if passed()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&entity)
        {
            return None;
        }
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
