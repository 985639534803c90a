//! Backends, connections and pools: what each database needs to be told, write
//! transactions that behave the same everywhere, pools that hand out checked connections,
//! and blocking calls from async code.

pub(crate) mod backend;
#[cfg(feature = "tokio")]
pub(crate) mod blocking;
pub(crate) mod caller_transaction;
pub(crate) mod pool;
pub(crate) mod reply_bound;
pub(crate) mod socket_of;
pub(crate) mod source;
pub(crate) mod transaction;
pub(crate) mod write_gate;
