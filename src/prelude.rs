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

pub use crate::connect::transaction::WriteTransaction;
pub use crate::drive::blocking::load::LoadByKey;
pub use crate::error::Error;
pub use crate::guard::pre_image::ChangedColumns;
pub use crate::guard::status::{HasStatus, Status};
pub use crate::guard::Guarded;
pub use crate::json::document::{GuardedJson, JsonDocument};
pub use crate::json::merge_in_place::GuardedJsonMerge;
#[cfg(feature = "locks")]
pub use crate::locks::fence::FencedWrite;
pub use crate::retry::RetryPolicy;
#[cfg(feature = "locks")]
pub use crate::status::claim::GuardedClaim;
pub use crate::status::transition::{GuardedStatusTransition, GuardedTransition};
pub use crate::write::batch::GuardedBatch;
pub use crate::write::bulk::GuardedBulk;
pub use crate::write::changed_columns::GuardedChanges;
pub use crate::write::entity::GuardedWrite;
pub use crate::write::modify::GuardedModify;
pub use crate::write::pessimistic::Pessimistic;
pub use crate::write::upsert::Upserted;
/// `#[derive(Guarded)]` and `#[derive(Status)]`, beside the traits of the same names.
pub use diesel_occ_derive::{Guarded, Status};
