//! Several guarded updates sent as one statement, so that a batch costs one round trip
//! instead of one per row. The SQL is PostgreSQL's: its `WITH` may hold data-modifying
//! statements, which MySQL and SQLite do not allow, so it is sent only where
//! [`OccBackend::COMBINES_UPDATES`](crate::OccBackend::COMBINES_UPDATES) says so. It is
//! generic over the backend only so that one batch method serves all three.
//!
//! ```sql
//! WITH "occ_0" AS (<update 0> RETURNING 0 AS "occ_row" [, <token column>]),
//!      "occ_1" AS (<update 1> RETURNING 1 AS "occ_row" [, <token column>]), ...
//! SELECT * FROM "occ_0" UNION ALL SELECT * FROM "occ_1" ...
//! ```
//!
//! Each update is the guarded statement a single write sends; a row it wrote comes back
//! with the update's index. All parts run on one snapshot, and PostgreSQL does not say
//! which of two updates of the same row in one statement wins, so callers never put one
//! key twice in a statement.

use std::marker::PhantomData;

use diesel::backend::Backend;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::sql_types::Integer;
use diesel::{Column, QueryResult, RunQueryDsl};

/// What each part of a [`Combined`] statement returns besides its index.
pub trait Returned {
    /// The SQL type of one result row.
    type SqlType;
    /// The token column, if the guard reads its new token back.
    const TOKEN_COLUMN: Option<&'static str>;
}

/// Only the index of each update that wrote its row: the guard computed the new token.
#[derive(Debug, Clone, Copy)]
pub struct RowOnly;

impl Returned for RowOnly {
    type SqlType = Integer;
    const TOKEN_COLUMN: Option<&'static str> = None;
}

/// The index and column `Col` as the update left it (an `xmin`, a database-clock stamp).
#[derive(Debug, Clone, Copy)]
pub struct RowAndToken<Col>(PhantomData<Col>);

impl<Col: Column> Returned for RowAndToken<Col> {
    type SqlType = (Integer, Col::SqlType);
    const TOKEN_COLUMN: Option<&'static str> = Some(Col::NAME);
}

/// Guarded updates `S` run as one statement, each returning what `R` says.
#[derive(Debug, Clone)]
pub struct Combined<S, R> {
    updates: Vec<S>,
    returned: PhantomData<R>,
}

impl<S, R> Combined<S, R> {
    /// The statement running `updates`; it needs at least one.
    pub fn new(updates: Vec<S>) -> Self {
        Combined {
            updates,
            returned: PhantomData,
        }
    }
}

impl<S, R: Returned> Query for Combined<S, R> {
    type SqlType = R::SqlType;
}

impl<S, R, DB> QueryFragment<DB> for Combined<S, R>
where
    DB: Backend,
    S: QueryFragment<DB>,
    R: Returned,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        if self.updates.is_empty() {
            return Err(diesel::result::Error::QueryBuilderError(
                "a combined statement needs at least one update".into(),
            ));
        }
        // The text depends on the number of updates: keep it out of the statement cache.
        out.unsafe_to_cache_prepared();
        out.push_sql("WITH ");
        for (i, update) in self.updates.iter().enumerate() {
            if i > 0 {
                out.push_sql(", ");
            }
            out.push_identifier(&format!("occ_{i}"))?;
            out.push_sql(" AS (");
            update.walk_ast(out.reborrow())?;
            // The index is ours, never user data: a literal keeps the binds the updates'.
            out.push_sql(&format!(" RETURNING {i} AS "));
            out.push_identifier("occ_row")?;
            if let Some(column) = R::TOKEN_COLUMN {
                out.push_sql(", ");
                out.push_identifier(column)?;
            }
            out.push_sql(")");
        }
        for i in 0..self.updates.len() {
            out.push_sql(if i == 0 {
                " SELECT * FROM "
            } else {
                " UNION ALL SELECT * FROM "
            });
            out.push_identifier(&format!("occ_{i}"))?;
        }
        Ok(())
    }
}

impl<S, R> QueryId for Combined<S, R> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<S, R, Conn> RunQueryDsl<Conn> for Combined<S, R> {}
