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
pub(crate) mod claim_filter;
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
pub(crate) mod hooked;
pub(crate) mod transition;
pub(crate) mod transition_op;
