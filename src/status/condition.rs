//! Conditions of a transition on other columns of the row (`ship` only while
//! `paid_at IS NOT NULL`), checked in the transition's own `WHERE`.
//!
//! A transition that matched nothing while its row is in an allowed state (and, from a
//! copy, at the copy's token) missed because the row did not meet the condition when
//! the statement ran: that is its answer, even if the row meets it by the time it is
//! read back (a payment recorded a moment later is a later event).

use diesel::backend::Backend;
use diesel::expression::Expression;
use diesel::query_builder::{AstPass, QueryFragment, QueryId};
use diesel::sql_types::BoolOrNullableBool;
use diesel::QueryResult;

use crate::connect::backend::OccBackend;
use crate::sql::statement::Unguarded;

/// `(<condition>)`: a caller's boolean expression on the entity's table, added to a
/// transition's `WHERE`.
#[derive(Debug, Clone, Copy)]
pub struct When<G>(pub(crate) G);

impl<G, DB> QueryFragment<DB> for When<G>
where
    DB: Backend,
    G: QueryFragment<DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_sql("(");
        self.0.walk_ast(out.reborrow())?;
        out.push_sql(")");
        Ok(())
    }
}

impl<G> QueryId for When<G> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

/// A condition a transition on backend `DB` may carry; nothing ([`Unguarded`]) for plain
/// transitions.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a condition a transition can carry",
    note = "a transition's condition is a boolean diesel expression on the entity's own table, such as `orders::paid_at.is_not_null()`"
)]
pub trait TransitionCondition<DB>: Clone {
    /// The condition as SQL, for the refusal of a move that did not meet it; `None` when
    /// there is none.
    fn sql(&self) -> QueryResult<Option<String>>;
}

impl<DB> TransitionCondition<DB> for Unguarded {
    fn sql(&self) -> QueryResult<Option<String>> {
        Ok(None)
    }
}

impl<G, DB> TransitionCondition<DB> for When<G>
where
    DB: OccBackend,
    G: Expression + QueryFragment<DB> + Clone,
    G::SqlType: BoolOrNullableBool,
{
    fn sql(&self) -> QueryResult<Option<String>> {
        DB::render(&self.0).map(Some)
    }
}
