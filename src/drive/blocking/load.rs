//! The reads an entity's writes need on a blocking connection ([`LoadByKey`]), and the
//! check that a time guard's column stores its tokens exactly.

use diesel::connection::LoadConnection;
use diesel::dsl::{AsSelect, Filter};
use diesel::query_builder::{QueryFragment, QueryId};
use diesel::query_dsl::methods::{FilterDsl, LoadQuery, SelectDsl};
use diesel::query_source::QuerySource;
use diesel::{OptionalExtension, QueryResult, RunQueryDsl, Selectable};

use crate::connect::backend::OccBackend;
use crate::connect::transaction::in_transaction;
use crate::drive::blocking::executor::classify;
use crate::error::Error;
use crate::flow::row_read::judge_read;
use crate::guard::by_key::{by_key, rows_by_keys, ByKey, RowsByKeys};
use crate::guard::stored_precision::PrecisionCheck;
use crate::guard::Guarded;
use crate::sql::names::table_name;
use crate::sql::statement::{LatestRead, RowLock};

/// What the executor needs of an entity on connection `C`: its table's name and a read
/// of the latest committed row by key (a locking read inside a transaction), to explain a write that
/// matched no row. Implemented for every [`Guarded`] + [`Selectable`] entity whose query
/// fits `C`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be read by key on `{C}`",
    note = "the connection must be a diesel connection of a backend diesel-occ supports, and the entity `Selectable` on its backend",
    note = "on a diesel-async connection, call the async API instead: `use diesel_occ::asynchronous::prelude::*`, not `diesel_occ::prelude::*`"
)]
pub trait LoadByKey<C>: Guarded {
    /// The row with `key`, if it exists, as last committed. Inside a transaction the read
    /// locks the row until the transaction ends.
    fn load_by_key(conn: &mut C, key: &Self::Key) -> QueryResult<Option<Self>>;

    /// The row with `key`, if it exists, by a plain read (inside a transaction, as the
    /// transaction's snapshot shows it, without a lock): the read of an optimistic
    /// read-modify-write, whose guarded write finds out whether the row moved on since.
    fn read_by_key(conn: &mut C, key: &Self::Key) -> QueryResult<Option<Self>>;

    /// The row with `key` read with the row lock `lock` (`FOR UPDATE`, `SKIP LOCKED`), for
    /// pessimistic writes inside a transaction.
    fn lock_by_key(conn: &mut C, key: &Self::Key, lock: RowLock) -> QueryResult<Option<Self>>;

    /// The rows with any of `keys` that exist, in no particular order, read as
    /// [`load_by_key`](Self::load_by_key) reads one: one statement for all of them.
    fn load_by_keys(conn: &mut C, keys: &[Self::Key]) -> QueryResult<Vec<Self>>;

    /// The table's SQL name, for messages.
    fn table_name() -> &'static str;

    /// The row with `key`, by a plain read as [`read_by_key`](Self::read_by_key) makes
    /// it, or [`Error::NotFound`] naming the table and key (answered 404 by the `http`
    /// feature's `Problem`). A row that does not read as `Self` is
    /// [`Error::InvalidData`] naming the columns; a database error is classified as the
    /// library's writes classify theirs (a lost connection, a retryable one).
    fn find_by_key(conn: &mut C, key: &Self::Key) -> Result<Self, Error>
    where
        C: LoadConnection,
        C::Backend: OccBackend,
    {
        let read = Self::read_by_key(conn, key);
        // A load reads every column: any of them may be the one that does not read.
        let suspects = "one of its columns";
        judge_read(Self::table_name(), key, suspects, read, |e| {
            classify(conn, e)
        })
    }
}

impl<T, C> LoadByKey<C> for T
where
    T: Guarded + Selectable<C::Backend>,
    C: LoadConnection,
    C::Backend: OccBackend,
    T::Table: 'static,
    <T::Table as QuerySource>::FromClause: QueryFragment<C::Backend>,
    T::SelectExpression: QueryId,
    T::Table: FilterDsl<T::KeyPredicate>,
    Filter<T::Table, T::KeyPredicate>: SelectDsl<AsSelect<T, C::Backend>>,
    ByKey<T, C::Backend>: LoadQuery<'static, C, T>,
    T::Table: FilterDsl<T::KeysPredicate>,
    Filter<T::Table, T::KeysPredicate>: SelectDsl<AsSelect<T, C::Backend>>,
    RowsByKeys<T, C::Backend>: LoadQuery<'static, C, T>,
{
    fn load_by_key(conn: &mut C, key: &Self::Key) -> QueryResult<Option<Self>> {
        let locking = in_transaction(conn);
        by_key::<T, C::Backend, _>(key, LatestRead::new, locking)
            .get_result(conn)
            .optional()
    }

    fn read_by_key(conn: &mut C, key: &Self::Key) -> QueryResult<Option<Self>> {
        by_key::<T, C::Backend, _>(key, LatestRead::new, false)
            .get_result(conn)
            .optional()
    }

    fn lock_by_key(conn: &mut C, key: &Self::Key, lock: RowLock) -> QueryResult<Option<Self>> {
        by_key::<T, C::Backend, _>(key, LatestRead::locked, lock)
            .get_result(conn)
            .optional()
    }

    fn load_by_keys(conn: &mut C, keys: &[Self::Key]) -> QueryResult<Vec<Self>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        rows_by_keys::<T, C::Backend>(keys, in_transaction(conn)).load(conn)
    }

    fn table_name() -> &'static str {
        table_name::<T::Table, C::Backend>(&T::table())
    }
}

/// Refuses a guard whose time tokens the column of entity `T` would not store exactly.
/// Checked once per entity and backend in a process; only a column that passed is
/// remembered, so a refused one is looked at again once it is widened.
pub(crate) fn check_stored_precision<T, C>(conn: &mut C) -> Result<(), Error>
where
    T: LoadByKey<C>,
    C: LoadConnection,
    C::Backend: OccBackend,
{
    run_precision_check(conn, PrecisionCheck::of::<T, C::Backend>(T::table_name()))
}

/// Reads the column of `check` (if any) and judges it.
pub(crate) fn run_precision_check<C>(
    conn: &mut C,
    check: Option<PrecisionCheck>,
) -> Result<(), Error>
where
    C: LoadConnection,
    C::Backend: OccBackend,
{
    let Some(check) = check else {
        return Ok(());
    };
    let (schema, name, column) = check.column();
    let stored = C::Backend::stored_second_digits(conn, schema, name, column)
        .map_err(|e| classify(conn, e))?;
    check.judge(stored)
}
