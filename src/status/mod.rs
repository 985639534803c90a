//! Status enums whose allowed transitions are declared next to their variants
//! (`#[derive(Status)]`), and the SQL that checks them.
//!
//! ```ignore
//! #[derive(Debug, Clone, Copy, PartialEq, Eq, diesel_occ::Status)]
//! #[occ(storage = "text")]               // or "integer": the discriminants are stored
//! enum OrderStatus {
//!     Valid,                             // stored as "valid"
//!     #[occ(from(Valid))]
//!     Shipped,
//!     #[occ(from(Valid), rename = "canceled")]
//!     Cancelled,
//!     #[occ(from(Shipped))]
//!     Delivered,
//! }
//! ```
//!
//! The derive writes the diesel mapping for the column (`Text` or `Integer`, on every
//! backend): a stored value that is no variant fails the read with that value in the
//! message. A `from(...)` naming no variant is a compile error at the name.

#[cfg(feature = "locks")]
pub(crate) mod claim;
#[cfg(feature = "locks")]
pub(crate) mod claim_attempts;
#[cfg(feature = "locks")]
pub(crate) mod claim_heartbeat;
#[cfg(feature = "locks")]
pub(crate) mod claim_in_one;
#[cfg(feature = "locks")]
pub(crate) mod claim_op;
#[cfg(feature = "locks")]
pub(crate) mod claim_retry;
#[cfg(feature = "locks")]
pub(crate) mod claimable_rows;
pub(crate) mod condition;
#[cfg(feature = "locks")]
pub(crate) mod finish_claims;
pub(crate) mod transition;
pub(crate) mod transition_op;

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
