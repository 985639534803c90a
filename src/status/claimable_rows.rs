//! The read at the heart of every claim: up to N rows a claim may take, in the order the
//! request asks for, locked where the backend locks rows, passing over rows other workers
//! hold.
//!
//! ```sql
//! SELECT <columns> FROM tasks WHERE <claimable> [ORDER BY <key>] LIMIT <n> FOR UPDATE SKIP LOCKED
//! ```
//!
//! The one-statement claim selects the keys alone (as its CTE or `IN` subquery); MySQL's
//! claim transaction, and counted claims on every backend, select whole rows. A claim in
//! key order (without `reclaim_after`, whose `OR` no one index serves in key order) stays
//! an index walk that stops after N entries at any queue length when the table has an
//! index on the status column followed by the key columns (an index on the
//! status column alone is one on InnoDB, which ends it with the primary key, and on SQLite
//! when the key is the rowid); without it, the database sorts every claimable row to take
//! the first N.

use diesel::expression::Expression;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::serialize::ToSql;
use diesel::sql_types::{BigInt, HasSqlType};
use diesel::{QueryResult, RunQueryDsl, Table};

use crate::connect::backend::OccBackend;
use crate::status::claim::ClaimOrder;

/// The largest limit written into the SQL where the backend wants it there: each limit is
/// its own cached statement (for each kind of claim), so a worker that varies its limit
/// adds at most this many per kind to its connection's cache; larger limits are bound.
const LIMITS_IN_SQL_UP_TO: i64 = 1000;

/// `SELECT <select> FROM <table> WHERE <filter> [ORDER BY <key>] LIMIT <n>|?<skip locked>`.
#[derive(Debug, Clone)]
pub struct ClaimableRows<T: Table, Select, Filter> {
    from: T::FromClause,
    select: Select,
    key: T::PrimaryKey,
    filter: Filter,
    order: ClaimOrder,
    limit: i64,
}

impl<T: Table, Select, Filter> ClaimableRows<T, Select, Filter> {
    /// Up to `limit` rows of `table` that match `filter`, as `select`, in `order`.
    pub(crate) fn new(
        table: T,
        select: Select,
        filter: Filter,
        order: ClaimOrder,
        limit: usize,
    ) -> Self {
        ClaimableRows {
            from: diesel::QuerySource::from_clause(&table),
            select,
            key: table.primary_key(),
            filter,
            order,
            limit: i64::try_from(limit).unwrap_or(i64::MAX),
        }
    }
}

impl<T, Select, Filter, DB> QueryFragment<DB> for ClaimableRows<T, Select, Filter>
where
    DB: OccBackend + HasSqlType<BigInt>,
    i64: ToSql<BigInt, DB>,
    T: Table,
    T::FromClause: QueryFragment<DB>,
    T::PrimaryKey: QueryFragment<DB>,
    Select: QueryFragment<DB>,
    Filter: QueryFragment<DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_sql("SELECT ");
        self.select.walk_ast(out.reborrow())?;
        out.push_sql(" FROM ");
        self.from.walk_ast(out.reborrow())?;
        out.push_sql(" WHERE ");
        self.filter.walk_ast(out.reborrow())?;
        if self.order == ClaimOrder::ByKey {
            out.push_sql(" ORDER BY ");
            self.key.walk_ast(out.reborrow())?;
        }
        out.push_sql(" LIMIT ");
        if DB::LIMIT_IN_SQL && self.limit <= LIMITS_IN_SQL_UP_TO {
            // A number the library formats itself: nothing of the caller's reaches the SQL.
            out.push_sql(&self.limit.to_string());
        } else {
            out.push_bind_param::<BigInt, i64>(&self.limit)?;
        }
        out.push_sql(DB::SKIP_LOCKED);
        Ok(())
    }
}

impl<T: Table, Select: Expression, Filter> Query for ClaimableRows<T, Select, Filter> {
    type SqlType = Select::SqlType;
}

// The order and (up to a size) the limit are in the text: the text keys the statement cache.
impl<T: Table, Select, Filter> QueryId for ClaimableRows<T, Select, Filter> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<T: Table, Select, Filter, Conn> RunQueryDsl<Conn> for ClaimableRows<T, Select, Filter> {}
