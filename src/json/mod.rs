//! JSON extension columns: read-merge-write of the document that keeps every concurrent
//! writer's keys, and the one-statement merge done by the database.

pub(crate) mod document;
pub(crate) mod merge_in_place;
