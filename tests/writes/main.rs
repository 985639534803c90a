//! Guarded writes and their tokens: updates, saves, deletes, inserts, upserts, batches,
//! bulk updates, read-modify-write, JSON edits and merges, on every backend and both
//! executors.
//!
//! One test binary per area (each binary links the whole dependency tree again), a
//! module per topic; `cargo test --test writes <module>::` runs one topic.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod advance_in_sql;
mod bad_input;
mod batch;
mod both_paths;
mod bulk;
mod caller_transaction;
mod concurrency;
mod database_clock;
mod diesel_attributes;
mod error_classification;
mod excluded_fields;
mod guarded_update;
mod insert;
mod json;
mod json_paths;
mod last_modified;
mod latest_row_reread;
mod modify;
mod names_and_types;
mod pessimistic;
mod pre_image;
mod refused_write;
mod row_version;
mod stateless;
mod statement_cache;
mod token_precision;
mod transient_errors;
mod unreadable_tokens;
mod updated_at;
mod upsert;
mod version_ownership;
mod version_row;
mod web_glue;
mod xmin;
