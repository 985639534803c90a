//! Claims, heartbeats and ends of claims on a blocking connection, run again after a
//! transient failure under the claims' policy ([`claim_run`]).

use diesel::Connection;

use crate::connect::transaction::in_transaction;
use crate::error::Error;
use crate::flow::claim_policy::claim_run;
use crate::retry::Stop;

/// Runs `op` on `conn`, again while it fails for a transient reason.
pub(crate) fn retried<C: Connection, T>(
    conn: &mut C,
    mut op: impl FnMut(&mut C) -> Result<T, Error>,
) -> Result<T, Error> {
    let mut run = claim_run(in_transaction(conn));
    loop {
        match op(conn) {
            Ok(value) => return Ok(value),
            Err(error) => std::thread::sleep(run.wait_after::<Error>(Stop::Occ(error))?),
        }
    }
}
