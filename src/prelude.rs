//! Everything a caller of diesel-occ needs in scope, in one import:
//!
//! ```
//! use diesel_occ::prelude::*;
//! ```
//!
//! It brings the derives and the traits whose methods you call on your entities
//! (`guarded_save`, `modify`, `merge_json`, `transition`, ...), plus [`Error`] and
//! [`RetryPolicy`], which nearly every call names. Nothing here clashes with
//! `diesel::prelude::*`.

pub use crate::batch::GuardedBatch;
pub use crate::bulk::GuardedBulk;
#[cfg(feature = "locks")]
pub use crate::claim::GuardedClaim;
pub use crate::connection::WriteTransaction;
pub use crate::error::Error;
#[cfg(feature = "locks")]
pub use crate::fence::FencedWrite;
pub use crate::guard::Guarded;
pub use crate::json::{GuardedJson, JsonDocument};
pub use crate::json_merge::GuardedJsonMerge;
pub use crate::modify::GuardedModify;
pub use crate::pessimistic::Pessimistic;
pub use crate::pre_image::{ChangedColumns, GuardedChanges};
pub use crate::retry::RetryPolicy;
pub use crate::status::{HasStatus, Status};
pub use crate::transition::{GuardedStatusTransition, GuardedTransition};
pub use crate::update::{GuardedWrite, LoadByKey};
/// `#[derive(Guarded)]` and `#[derive(Status)]`, beside the traits of the same names.
pub use diesel_occ_derive::{Guarded, Status};
