//! Status enums and the entities that have a status column: what an entity tells the
//! library about its state, and the SQL that checks a state is one of several. The
//! guarded transitions and claims built on them are in `status/`.

use std::fmt::Debug;
use std::marker::PhantomData;

use diesel::backend::Backend;
use diesel::query_builder::{AstPass, QueryFragment, QueryId};
use diesel::serialize::ToSql;
use diesel::sql_types::HasSqlType;
use diesel::{Column, QueryResult};

use crate::guard::Guarded;

/// A status enum: its states and, for each, the states that may move to it.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a status enum",
    label = "the `#[occ(status)]` field's type",
    note = "derive it on an enum of states: `#[derive(diesel_occ::Status)] enum OrderStatus {{ .. }}`"
)]
pub trait Status: Copy + Eq + Debug + Send + Sync + 'static {
    /// Every state, in declaration order.
    const ALL: &'static [Self];

    /// The states allowed to move to `to` (empty for a state nothing moves to).
    fn sources(to: Self) -> &'static [Self];

    /// The state as stored (its text, or its number as text), for messages.
    fn name(self) -> &'static str;

    /// Whether a row in state `from` may move to `to`.
    fn allows(from: Self, to: Self) -> bool {
        Self::sources(to).contains(&from)
    }
}

/// An entity with a status column (`#[occ(status)]` on its field).
pub trait HasStatus: Guarded {
    /// The field's status enum.
    type Status: Status;
    /// The status column.
    type StatusColumn: Column<Table = Self::Table> + Default;

    /// The state this copy was read in.
    fn status(&self) -> Self::Status;

    /// Records the state a transition moved the row to.
    fn set_status(&mut self, status: Self::Status);
}

/// `"status" IN (?, ?, ...)`: the row is in one of `states`. With none it is `1 = 0`.
#[derive(Debug, Clone, Copy)]
pub struct StatusIn<Col, S: 'static> {
    states: &'static [S],
    column: PhantomData<Col>,
}

impl<Col, S> StatusIn<Col, S> {
    /// The condition that the row is in one of `states`.
    pub fn new(states: &'static [S]) -> Self {
        StatusIn {
            states,
            column: PhantomData,
        }
    }
}

impl<Col, S, DB> QueryFragment<DB> for StatusIn<Col, S>
where
    DB: Backend + HasSqlType<Col::SqlType>,
    Col: Column,
    S: ToSql<Col::SqlType, DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        // The number of placeholders follows the states: key the cache by the text.
        if self.states.is_empty() {
            out.push_sql("1 = 0");
            return Ok(());
        }
        out.push_identifier(Col::NAME)?;
        out.push_sql(" IN (");
        for (i, state) in self.states.iter().enumerate() {
            if i > 0 {
                out.push_sql(", ");
            }
            out.push_bind_param::<Col::SqlType, S>(state)?;
        }
        out.push_sql(")");
        Ok(())
    }
}

impl<Col, S> QueryId for StatusIn<Col, S> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}
