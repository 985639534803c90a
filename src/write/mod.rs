//! The writes: an entity's guarded updates and deletes, batches,
//! bulk updates, read-modify-write with retries, pessimistic writes, and operations
//! guarded by a version row.

pub(crate) mod batch;
pub(crate) mod bulk;
pub(crate) mod changed_columns;
pub(crate) mod entity;
pub(crate) mod insert;
pub(crate) mod modify;
pub(crate) mod operation;
pub(crate) mod pessimistic;
pub(crate) mod updated_at_touch;
pub(crate) mod upsert;
