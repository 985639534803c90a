//! The reads of an entity's rows by key, as both drivers send them: one row (locked or
//! not), or the rows of many keys in one statement.

use diesel::associations::HasTable;
use diesel::dsl::{AsSelect, Filter, Select};
use diesel::query_builder::QueryId;
use diesel::query_dsl::methods::{FilterDsl, SelectDsl};
use diesel::{Selectable, SelectableHelper};

use super::Guarded;
use crate::sql::statement::LatestRead;

/// The `SELECT` of entity `T`'s row by key on backend `DB`.
pub(crate) type SelectByKey<T, DB> =
    Select<Filter<<T as HasTable>::Table, <T as Guarded>::KeyPredicate>, AsSelect<T, DB>>;

/// The read of entity `T`'s row by key on backend `DB`.
pub(crate) type ByKey<T, DB> = LatestRead<SelectByKey<T, DB>>;

/// The read of the row with `key`, made by `read` with `how` (locking or not): what the
/// blocking and the async reads by key send.
pub(crate) fn by_key<T, DB, How>(
    key: &T::Key,
    read: fn(SelectByKey<T, DB>, How) -> ByKey<T, DB>,
    how: How,
) -> ByKey<T, DB>
where
    T: Guarded + Selectable<DB>,
    DB: diesel::backend::Backend,
    T::SelectExpression: QueryId,
    T::Table: FilterDsl<T::KeyPredicate>,
    Filter<T::Table, T::KeyPredicate>: SelectDsl<AsSelect<T, DB>>,
{
    let filtered = FilterDsl::filter(T::table(), T::key_predicate(key));
    read(SelectDsl::select(filtered, T::as_select()), how)
}

/// The read of entity `T`'s rows by key on backend `DB`.
pub(crate) type RowsByKeys<T, DB> = LatestRead<
    Select<Filter<<T as HasTable>::Table, <T as Guarded>::KeysPredicate>, AsSelect<T, DB>>,
>;

/// The read of the rows with any of `keys`, one statement, locking them when `locking`.
pub(crate) fn rows_by_keys<T, DB>(keys: &[T::Key], locking: bool) -> RowsByKeys<T, DB>
where
    T: Guarded + Selectable<DB>,
    DB: diesel::backend::Backend,
    T::SelectExpression: QueryId,
    T::Table: FilterDsl<T::KeysPredicate>,
    Filter<T::Table, T::KeysPredicate>: SelectDsl<AsSelect<T, DB>>,
{
    let filtered = FilterDsl::filter(T::table(), T::keys_predicate(keys));
    LatestRead::new(SelectDsl::select(filtered, T::as_select()), locking)
}
