//! Locks and leases in a database table, leader election on them, and fenced writes that
//! refuse a paused holder's late writes.

pub(crate) mod backend;
pub(crate) mod belief;
pub(crate) mod campaign;
pub(crate) mod fence;
pub(crate) mod fence_op;
pub(crate) mod held;
pub(crate) mod leader;
pub(crate) mod lease;
pub(crate) mod lock;
pub(crate) mod lock_io;
pub(crate) mod lock_time;
