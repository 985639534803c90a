//! The library's operations as values, and running them on a blocking connection. The
//! public face is [`crate::op`].

pub(crate) mod batch;
pub(crate) mod bulk;
pub(crate) mod entity;
pub(crate) mod insert;
pub(crate) mod json;
pub(crate) mod modify;

pub use batch::{BatchDelete, BatchUpdate};
pub use bulk::BulkUpdate;
pub(crate) use entity::SavedState;
pub use entity::{Delete, SaveChanged, TouchStamp, Update, WriteExcluded};
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
    note = "the changes must be for the entity's table, the connection a diesel connection of a backend diesel-occ supports, and the guard's SQL must fit that backend (an `xmin` guard needs PostgreSQL)",
    note = "on a diesel-async connection, call the async API instead: `use diesel_occ::asynchronous::prelude::*`, not `diesel_occ::prelude::*`"
)]
pub trait Run<C> {
    /// Runs the operation on `conn`.
    #[doc(hidden)]
    fn run(self, conn: &mut C) -> Result<<Self as Operation>::Output, <Self as Operation>::Error>
    where
        Self: Operation + Sized;
}
