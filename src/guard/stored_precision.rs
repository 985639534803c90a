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

use diesel::connection::LoadConnection;

use crate::connect::backend::OccBackend;
use crate::error::Error;
use crate::guard::GuardKind;
use crate::write::entity::LoadByKey;
use crate::write::executor::classify;

/// Refuses a guard whose time tokens the column of entity `T` would not store exactly.
/// Checked once per entity and backend in a process; only a column that passed is
/// remembered, so a refused one is looked at again once it is widened.
pub(crate) fn check_stored_precision<T, C>(conn: &mut C) -> Result<(), Error>
where
    T: LoadByKey<C>,
    C: LoadConnection,
    C::Backend: OccBackend,
{
    let Some(token_digits) = T::Guard::TOKEN_DIGITS else {
        return Ok(());
    };
    static PASSED: OnceLock<Mutex<HashSet<(TypeId, &'static str)>>> = OnceLock::new();
    let passed = PASSED.get_or_init(Mutex::default);
    let entity = (TypeId::of::<T>(), std::any::type_name::<C::Backend>());
    if passed
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains(&entity)
    {
        return Ok(());
    }
    let column = T::GUARD_COLUMNS.first().copied().unwrap_or_default();
    let table = T::table_name();
    let (schema, name) = match table.rsplit_once('.') {
        Some((schema, name)) => (Some(schema), name),
        None => (None, table),
    };
    let stored = C::Backend::stored_second_digits(conn, schema, name, column)
        .map_err(|e| classify(conn, e))?;
    if let Some(stored) = stored.filter(|stored| *stored < token_digits) {
        let fits = if stored >= 3 {
            "`#[occ(last_modified(precision = \"millis\"))]`"
        } else {
            "`#[occ(last_modified(precision = \"seconds\"))]`"
        };
        return Err(Error::SchemaMismatch {
            table,
            column: column.to_string(),
            reason: format!(
                "the column keeps {stored} fractional digits of a second and the guard's \
                 tokens carry {token_digits}, so the database would round or cut each new \
                 token and the writer's own next write would conflict with it; add {fits} \
                 to the field, or declare the column with {token_digits} digits"
            ),
        });
    }
    passed
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(entity);
    Ok(())
}
