//! `key IN (?, ?, ...)`: the rows of many keys (of one column), in a statement that is
//! prepared once and then reused, whatever the number of keys.
//!
//! diesel's `eq_any` writes one placeholder per value and, outside PostgreSQL, keeps the
//! statement out of the connection's prepared-statement cache, so every batch is parsed
//! and planned again (on MySQL also prepared and closed, two more round trips). Here the
//! list is padded to the next power of two by repeating its last key, as Hibernate's
//! `in_clause_parameter_padding` does: a repeated key selects no other row, and a batch
//! of up to 512 keys is one of ten statements, each prepared once per connection. On
//! PostgreSQL the keys are one bound array (`= ANY(?)`), one statement for every size.

use diesel::backend::Backend;
use diesel::expression::{is_aggregate, AppearsOnTable, Expression, ValidGrouping};
use diesel::query_builder::{AstPass, QueryFragment, QueryId};
use diesel::serialize::ToSql;
use diesel::sql_types::{Bool, HasSqlType};
use diesel::{Column, QueryResult};

/// The longest list that is padded: the library's batches are at most 500 keys.
const PAD_UP_TO: usize = 512;

/// `<column> IN (<keys>, padded)`, or `<column> = ANY(?)` on PostgreSQL: the rows whose
/// key is one of `values`. An empty list selects nothing.
#[derive(Debug, Clone)]
pub struct KeyIn<Col, V> {
    column: Col,
    values: Vec<V>,
}

impl<Col, V> KeyIn<Col, V> {
    /// The rows of `column` equal to one of `values`.
    pub fn new(column: Col, values: Vec<V>) -> Self {
        KeyIn { column, values }
    }

    /// `<column> IN (?, ?, ...)` with the list padded to a power of two.
    #[cfg_attr(not(any(feature = "sqlite", feature = "mysql")), allow(dead_code))]
    fn walk_padded<'b, DB>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()>
    where
        DB: Backend + HasSqlType<Col::SqlType>,
        Col: Column + QueryFragment<DB>,
        V: ToSql<Col::SqlType, DB>,
    {
        let Some(last) = self.values.last() else {
            out.push_sql("1 = 0");
            return Ok(());
        };
        // The statement's text depends only on the padded size: it stays cacheable, and
        // a connection holds at most one statement per power of two. Past `PAD_UP_TO` keys
        // the list is sent as it is, so that padding never nears the backends' limits on
        // bound values (32,766 on SQLite, 65,535 on MySQL).
        let count = self.values.len();
        let padded = if count <= PAD_UP_TO {
            count.next_power_of_two()
        } else {
            count
        };
        self.column.walk_ast(out.reborrow())?;
        out.push_sql(" IN (");
        for (i, value) in self
            .values
            .iter()
            .chain(std::iter::repeat(last))
            .take(padded)
            .enumerate()
        {
            if i > 0 {
                out.push_sql(", ");
            }
            out.push_bind_param::<Col::SqlType, V>(value)?;
        }
        out.push_sql(")");
        Ok(())
    }
}

impl<Col, V> Expression for KeyIn<Col, V> {
    type SqlType = Bool;
}

impl<Col: AppearsOnTable<QS>, V, QS> AppearsOnTable<QS> for KeyIn<Col, V> {}

impl<Col, V> ValidGrouping<()> for KeyIn<Col, V> {
    type IsAggregate = is_aggregate::Never;
}

// Not static: the text depends on the number of keys, so diesel's cache must key the
// statement by its text (which it does for a statement without a static id).
impl<Col, V> QueryId for KeyIn<Col, V> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

#[cfg(feature = "sqlite")]
impl<Col, V> QueryFragment<diesel::sqlite::Sqlite> for KeyIn<Col, V>
where
    Col: Column + QueryFragment<diesel::sqlite::Sqlite>,
    diesel::sqlite::Sqlite: HasSqlType<Col::SqlType>,
    V: ToSql<Col::SqlType, diesel::sqlite::Sqlite>,
{
    fn walk_ast<'b>(&'b self, out: AstPass<'_, 'b, diesel::sqlite::Sqlite>) -> QueryResult<()> {
        self.walk_padded(out)
    }
}

#[cfg(feature = "mysql")]
impl<Col, V> QueryFragment<diesel::mysql::Mysql> for KeyIn<Col, V>
where
    Col: Column + QueryFragment<diesel::mysql::Mysql>,
    diesel::mysql::Mysql: HasSqlType<Col::SqlType>,
    V: ToSql<Col::SqlType, diesel::mysql::Mysql>,
{
    fn walk_ast<'b>(&'b self, out: AstPass<'_, 'b, diesel::mysql::Mysql>) -> QueryResult<()> {
        self.walk_padded(out)
    }
}

#[cfg(feature = "postgres")]
impl<Col, V> QueryFragment<diesel::pg::Pg> for KeyIn<Col, V>
where
    Col: Column + QueryFragment<diesel::pg::Pg>,
    Col::SqlType: 'static,
    diesel::pg::Pg: HasSqlType<diesel::sql_types::Array<Col::SqlType>>,
    Vec<V>: ToSql<diesel::sql_types::Array<Col::SqlType>, diesel::pg::Pg>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, diesel::pg::Pg>) -> QueryResult<()> {
        if self.values.is_empty() {
            out.push_sql("1 = 0");
            return Ok(());
        }
        self.column.walk_ast(out.reborrow())?;
        out.push_sql(" = ANY(");
        out.push_bind_param::<diesel::sql_types::Array<Col::SqlType>, Vec<V>>(&self.values)?;
        out.push_sql(")");
        Ok(())
    }
}
