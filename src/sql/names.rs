//! Names: how tables are named in messages (by their SQL name, as the `table!` schema
//! gives it), and the rules for the names the library stores (lock names, resources,
//! owners, history entries).
//!
//! diesel keeps a table's SQL name (`#[sql_name = "legacy_items"]`, a schema prefix)
//! only inside the table's `FROM` clause, so the name is rendered from it once per table
//! type and kept for the life of the process (one short string per table).

use std::any::TypeId;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use diesel::query_builder::QueryFragment;
use diesel::query_source::QuerySource;

use crate::connect::backend::OccBackend;
use crate::error::Error;

/// The SQL name of `table` (`schema.name` when the schema names one), without quotes.
pub(crate) fn table_name<T, DB>(table: &T) -> &'static str
where
    T: QuerySource + 'static,
    T::FromClause: QueryFragment<DB>,
    DB: OccBackend,
{
    static NAMES: OnceLock<Mutex<HashMap<TypeId, &'static str>>> = OnceLock::new();
    let names = NAMES.get_or_init(Mutex::default);
    let mut names = names
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    names.entry(TypeId::of::<T>()).or_insert_with(|| {
        let name = match DB::render(&table.from_clause()) {
            Ok(sql) => unquote(&sql),
            Err(_) => std::any::type_name::<T>().to_owned(),
        };
        Box::leak(name.into_boxed_str())
    })
}

/// `"s"."t"` or `` `t` `` as `s.t` / `t`: quotes removed, doubled quotes undone.
pub(crate) fn unquote(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '"' && c != '`' {
            out.push(c);
            continue;
        }
        while let Some(inner) = chars.next() {
            if inner == c {
                if chars.peek() == Some(&c) {
                    out.push(c);
                    chars.next();
                } else {
                    break;
                }
            } else {
                out.push(inner);
            }
        }
    }
    out
}

/// The longest name or resource, in characters: what MySQL indexes in a two-column key of
/// `VARCHAR(191)` utf8mb4 columns. A longer name is refused rather than cut, since a cut
/// could make two names one.
pub const NAME_LIMIT: usize = 191;

/// Checks a name before it is sent: not empty, no NUL, at most [`NAME_LIMIT`] characters.
pub(crate) fn check_name(what: &'static str, name: &str) -> Result<(), Error> {
    let reason = if name.is_empty() {
        "it is empty".to_string()
    } else if name.contains('\0') {
        "it holds a NUL character, which PostgreSQL cannot store".to_string()
    } else if name.chars().count() > NAME_LIMIT {
        format!(
            "it has {} characters, over the limit of {NAME_LIMIT}",
            name.chars().count()
        )
    } else {
        return Ok(());
    };
    Err(Error::InvalidName {
        what,
        name: name.chars().take(64).collect(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::unquote;

    #[test]
    fn quoted_names_lose_their_quotes() {
        assert_eq!(unquote("\"legacy_items\""), "legacy_items");
        assert_eq!(unquote("`orders`"), "orders");
        assert_eq!(unquote("\"shop\".\"orders\""), "shop.orders");
        assert_eq!(unquote("\"odd\"\"name\""), "odd\"name");
    }
}
