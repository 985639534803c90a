//! Many guarded updates of one shape sent as one statement, so that a batch costs one
//! round trip instead of one per row. The SQL is PostgreSQL's (`UPDATE ... FROM`, `$n`
//! parameters); it is sent only where
//! [`OccBackend::COMBINES_UPDATES`](crate::OccBackend::COMBINES_UPDATES) says so, and is
//! generic over the backend only so that one batch method serves all three.
//!
//! Rows whose guarded updates render the same SQL (they set the same columns and check
//! the same guard) differ only in their bound values. Each row's values become one row of
//! a `VALUES` list, and the statement's text is the single update's with each parameter
//! `$i` read from that list instead:
//!
//! ```sql
//! UPDATE "t" SET "note" = "occ_values"."occ_1", "version" = "version" + 1
//! FROM (VALUES (0, $1, $2, $3), (1, $4, $5, $6)) AS "occ_values" ("occ_row", "occ_1", "occ_2", "occ_3")
//! WHERE ("t"."id" = "occ_values"."occ_2") AND "t"."version" = "occ_values"."occ_3"
//! RETURNING "occ_values"."occ_row" [, <token column>]
//! ```
//!
//! The guard and the assignments are the single write's, so a row is written exactly
//! when its own update would have written it; a row comes back with its index. Diesel
//! declares every parameter's type, so the `VALUES` columns have the types the single
//! statement's parameters have. PostgreSQL does not say which `VALUES` row updates a
//! target row that two of them match, so callers never put one key twice in a statement.
//!
//! Why not diesel's own builders: a changeset is an opaque `AsChangeset`, so its values
//! can only be had as the bound parameters of its rendered SQL.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::marker::PhantomData;

use diesel::backend::Backend;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::sql_types::Integer;
use diesel::{Column, QueryResult, RunQueryDsl};

use crate::connect::backend::OccBackend;

/// The most bound values one statement may carry: PostgreSQL's wire protocol counts them
/// in 16 bits.
pub(crate) const BINDS_PER_STATEMENT: usize = u16::MAX as usize;

/// A single-row statement whose SQL can serve as the template of a [`ValuesUpdate`].
pub trait Template<DB> {
    /// Where, in the statement's SQL, its filter (` WHERE ...`) starts.
    fn filter_at(&self) -> QueryResult<usize>;
}

/// What each row of a [`ValuesUpdate`] returns besides its index.
pub trait Returned {
    /// The SQL type of one result row.
    type SqlType;
    /// The token column, if the guard reads its new token back.
    const TOKEN_COLUMN: Option<&'static str>;
}

/// Only the index of each row written: the guard computed the new token.
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

/// The guarded updates of rows of one shape as one statement, each row returning what
/// `R` says.
#[derive(Debug, Clone)]
pub struct ValuesUpdate<S, R> {
    text: String,
    rows: Vec<S>,
    returned: PhantomData<R>,
}

impl<S, R: Returned> ValuesUpdate<S, R> {
    /// The statements that run `updates`: one per shape (per bind limit), each row
    /// returning its index in `updates`. The updates must not share a key.
    pub fn group<DB>(updates: Vec<S>) -> QueryResult<Vec<Self>>
    where
        DB: OccBackend,
        S: QueryFragment<DB> + Template<DB>,
    {
        // Shapes in the order first seen, each with its rows' indexes.
        let mut shapes: Vec<(String, Vec<(usize, S)>)> = Vec::new();
        let mut by_text: HashMap<String, usize> = HashMap::new();
        for (index, update) in updates.into_iter().enumerate() {
            let text = DB::render(&update)?;
            let shape = match by_text.get(&text) {
                Some(&shape) => shape,
                None => {
                    by_text.insert(text.clone(), shapes.len());
                    shapes.push((text, Vec::new()));
                    shapes.len() - 1
                }
            };
            shapes[shape].1.push((index, update));
        }
        let mut statements = Vec::new();
        for (text, rows) in shapes {
            let template = Parts::of(&text, rows[0].1.filter_at()?)?;
            let most = BINDS_PER_STATEMENT / template.parameters.max(1);
            let mut rows = rows.into_iter().peekable();
            while rows.peek().is_some() {
                let chunk: Vec<(usize, S)> = rows.by_ref().take(most).collect();
                let indexes: Vec<usize> = chunk.iter().map(|(index, _)| *index).collect();
                statements.push(ValuesUpdate {
                    text: template.statement::<R>(&indexes),
                    rows: chunk.into_iter().map(|(_, update)| update).collect(),
                    returned: PhantomData,
                });
            }
        }
        Ok(statements)
    }
}

/// A single update's SQL split at its filter, with each parameter `$i` replaced by the
/// `VALUES` column `"occ_values"."occ_i"`.
struct Parts {
    head: String,
    filter: String,
    parameters: usize,
}

impl Parts {
    fn of(text: &str, filter_at: usize) -> QueryResult<Self> {
        let (head, filter) = text.split_at(filter_at);
        let mut parameters = 0;
        let head = read_from_values(head, &mut parameters)?;
        let filter = read_from_values(filter, &mut parameters)?;
        Ok(Parts {
            head,
            filter,
            parameters,
        })
    }

    /// The statement's text for rows `indexes`: their values are bound in that order.
    fn statement<R: Returned>(&self, indexes: &[usize]) -> String {
        let k = self.parameters;
        let mut sql = String::with_capacity(
            self.head.len() + self.filter.len() + indexes.len() * (k * 8 + 8) + 64,
        );
        sql.push_str(&self.head);
        sql.push_str(" FROM (VALUES ");
        for (row, index) in indexes.iter().enumerate() {
            if row > 0 {
                sql.push_str(", ");
            }
            // The index is ours, never user data: a literal keeps the binds the rows'.
            let _ = write!(sql, "({index}");
            for i in 1..=k {
                let _ = write!(sql, ", ${}", row * k + i);
            }
            sql.push(')');
        }
        sql.push_str(r#") AS "occ_values" ("occ_row""#);
        for i in 1..=k {
            let _ = write!(sql, r#", "occ_{i}""#);
        }
        sql.push(')');
        sql.push_str(&self.filter);
        sql.push_str(r#" RETURNING "occ_values"."occ_row""#);
        if let Some(column) = R::TOKEN_COLUMN {
            let _ = write!(sql, r#", "{}""#, column.replace('"', "\"\""));
        }
        sql
    }
}

/// `sql` with each parameter `$i` outside quotes replaced by `"occ_values"."occ_i"`.
/// Diesel numbers parameters in the order it binds them, so they must come as
/// `$1, $2, ...` continuing from `seen`; anything else is an error, never a statement
/// that binds values to the wrong columns.
fn read_from_values(sql: &str, seen: &mut usize) -> QueryResult<String> {
    let mut out = String::with_capacity(sql.len() + 16);
    let mut chars = sql.char_indices().peekable();
    let mut quote = None;
    while let Some((_, c)) = chars.next() {
        match (quote, c) {
            // A doubled quote inside quotes is an escaped one; a single one closes.
            (Some(q), c) if c == q => {
                out.push(c);
                if chars.peek().map(|&(_, next)| next) == Some(q) {
                    out.push(q);
                    chars.next();
                } else {
                    quote = None;
                }
            }
            (Some(_), c) => out.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                out.push(c);
            }
            (None, '$') if chars.peek().is_some_and(|&(_, d)| d.is_ascii_digit()) => {
                let mut number = 0usize;
                while let Some(&(_, d)) = chars.peek() {
                    let Some(digit) = d.to_digit(10) else { break };
                    number = number.saturating_mul(10).saturating_add(digit as usize);
                    chars.next();
                }
                if number != *seen + 1 {
                    return Err(diesel::result::Error::QueryBuilderError(
                        format!(
                            "a batch statement's parameter ${number} came where ${} was expected",
                            *seen + 1
                        )
                        .into(),
                    ));
                }
                *seen = number;
                let _ = write!(out, r#""occ_values"."occ_{number}""#);
            }
            (None, c) => out.push(c),
        }
    }
    Ok(out)
}

impl<S, R: Returned> Query for ValuesUpdate<S, R> {
    type SqlType = R::SqlType;
}

impl<S, R, DB> QueryFragment<DB> for ValuesUpdate<S, R>
where
    DB: Backend,
    S: QueryFragment<DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        // The text depends on the number of rows: keep it out of the statement cache.
        out.unsafe_to_cache_prepared();
        out.push_sql(&self.text);
        Ok(())
    }

    // The rows' own values, in order: each row binds what its single update binds, which
    // the text reads as that row's `$i`s.
    fn collect_binds<'b>(
        &'b self,
        out: &mut DB::BindCollector<'b>,
        metadata_lookup: &mut DB::MetadataLookup,
        backend: &'b DB,
    ) -> QueryResult<()> {
        for row in &self.rows {
            row.collect_binds(out, metadata_lookup, backend)?;
        }
        Ok(())
    }
}

impl<S, R> QueryId for ValuesUpdate<S, R> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<S, R, Conn> RunQueryDsl<Conn> for ValuesUpdate<S, R> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_outside_quotes_read_from_the_values_list() {
        let mut seen = 0;
        let sql = read_from_values(
            r#"UPDATE "a$1" SET "b" = $1, "c" = '$9''$' WHERE "d" = $2"#,
            &mut seen,
        )
        .unwrap();
        assert_eq!(
            sql,
            r#"UPDATE "a$1" SET "b" = "occ_values"."occ_1", "c" = '$9''$' WHERE "d" = "occ_values"."occ_2""#
        );
        assert_eq!(seen, 2);
    }

    #[test]
    fn parameters_out_of_order_are_refused() {
        assert!(read_from_values("SET a = $2", &mut 0).is_err());
        assert!(read_from_values("SET a = $1, b = $1", &mut 0).is_err());
    }

    #[test]
    fn a_statement_binds_each_rows_values_in_order() {
        let text = r#"UPDATE "t" SET "n" = $1 WHERE ("t"."id" = $2)"#;
        let parts = Parts::of(text, text.find(" WHERE").unwrap()).unwrap();
        assert_eq!(
            parts.statement::<RowOnly>(&[4, 7]),
            r#"UPDATE "t" SET "n" = "occ_values"."occ_1" FROM (VALUES (4, $1, $2), (7, $3, $4)) AS "occ_values" ("occ_row", "occ_1", "occ_2") WHERE ("t"."id" = "occ_values"."occ_2") RETURNING "occ_values"."occ_row""#
        );
    }

    /// A row binding 100 values: `UPDATE "t" SET "c" = $1 WHERE "k" IN ($2, ..., $100)`.
    #[cfg(feature = "postgres")]
    struct Wide([i32; 100]);

    #[cfg(feature = "postgres")]
    impl QueryFragment<diesel::pg::Pg> for Wide {
        fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, diesel::pg::Pg>) -> QueryResult<()> {
            out.push_sql(r#"UPDATE "t" SET "c" = "#);
            out.push_bind_param::<Integer, _>(&self.0[0])?;
            out.push_sql(r#" WHERE "k" IN ("#);
            for (i, value) in self.0.iter().enumerate().skip(1) {
                if i > 1 {
                    out.push_sql(", ");
                }
                out.push_bind_param::<Integer, _>(value)?;
            }
            out.push_sql(")");
            Ok(())
        }
    }

    #[cfg(feature = "postgres")]
    impl Template<diesel::pg::Pg> for Wide {
        fn filter_at(&self) -> QueryResult<usize> {
            Ok(r#"UPDATE "t" SET "c" = $1"#.len())
        }
    }

    /// Rows that bind more than 65,535 values in all are split into statements under the
    /// limit, each numbering its parameters from `$1`, every row's index kept.
    #[cfg(feature = "postgres")]
    #[test]
    fn rows_beyond_the_bind_limit_are_split() {
        let statements = ValuesUpdate::<Wide, RowOnly>::group::<diesel::pg::Pg>(
            (0..1000).map(|_| Wide([7; 100])).collect(),
        )
        .unwrap();
        let rows: Vec<usize> = statements.iter().map(|s| s.rows.len()).collect();
        assert_eq!(rows, [655, 345]);
        let second = &statements[1].text;
        assert!(second.contains("FROM (VALUES (655, $1, $2,"), "{second}");
        assert!(
            second.contains(&format!("(999, ${}, ", 344 * 100 + 1)),
            "{second}"
        );
        assert!(!second.contains(&format!("${}", 345 * 100 + 1)), "{second}");
    }
}
