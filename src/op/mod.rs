//! The library's writes as values. A method such as
//! [`guarded_update`](crate::GuardedWrite::guarded_update) builds one of these from its
//! arguments and runs it: [`Run`] on a blocking connection,
//! [`AsyncRun`](crate::asynchronous::AsyncRun) on a diesel-async one. The value owns what
//! the write needs (key, expected token, changes, stamp), so one description of a write
//! serves both APIs, and SQLite's async connection runs the blocking [`Run`] whole on its
//! own thread.
//!
//! You never build one yourself; you name one in the bounds of a helper generic in the
//! connection, as diesel's own helpers name a query:
//!
//! ```
//! # #[cfg(all(feature = "async", feature = "postgres"))]
//! # mod example {
//! # use diesel::prelude::*;
//! # diesel::table! { orders (id) { id -> BigInt, name -> Text, version -> BigInt } }
//! # #[derive(Debug, Clone, Queryable, Selectable, Identifiable, diesel_occ::Guarded)]
//! # #[diesel(table_name = orders)]
//! # struct Order { id: i64, name: String, #[occ(version)] version: i64 }
//! use diesel_occ::asynchronous::{prelude::*, AsyncRun};
//! use diesel_occ::op::Update;
//! use diesel_occ::Error;
//!
//! /// Renames an order on any diesel-async connection the library supports.
//! async fn rename<C>(conn: &mut C, order: &Order, name: &str) -> Result<(), Error>
//! where
//!     Update<Order, diesel::dsl::Eq<orders::name, String>>: AsyncRun<C>,
//! {
//!     order.guarded_update(conn, orders::name.eq(name.to_owned())).await?;
//!     Ok(())
//! }
//! # }
//! ```

pub(crate) mod batch;
pub(crate) mod bulk;
mod entity;
pub(crate) mod insert;
pub(crate) mod json;
pub(crate) mod modify;

pub use batch::{BatchDelete, BatchUpdate};
pub use bulk::BulkUpdate;
pub(crate) use entity::SavedState;
pub use entity::{Delete, TouchStamp, Update, WriteExcluded};
pub use insert::{Insert, Upsert};
pub use json::{JsonEdit, JsonMerge, JsonMergeNoToken};
pub use modify::Modify;

use crate::error::Error;

/// An operation of the library and what it answers when it succeeds.
pub trait Operation {
    /// What the operation answers (the new token of an update, `()` for a delete, ...).
    type Output;

    /// How it fails: the library's [`Error`], or the caller's own error type where the
    /// caller's code runs inside (a read-modify-write's change).
    type Error: From<Error>;
}

/// An [`Operation`] that runs on blocking connection `C`.
///
/// Not a trait to implement: it holds for each of the library's operations on every
/// diesel connection the entity's guard can run on.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot run on `{C}`",
    note = "the changes must be for the entity's table, the connection a diesel connection of a backend diesel-occ supports, and the guard's SQL must fit that backend (an `xmin` guard needs PostgreSQL)"
)]
pub trait Run<C> {
    /// Runs the operation on `conn`.
    #[doc(hidden)]
    fn run(self, conn: &mut C) -> Result<<Self as Operation>::Output, <Self as Operation>::Error>
    where
        Self: Operation + Sized;
}
