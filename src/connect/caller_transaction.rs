//! Statements in a transaction the caller controls.
//!
//! PostgreSQL aborts a whole transaction when one of its statements fails (a unique or
//! check violation, a bad cast): every later statement answers "current transaction is
//! aborted" until it ends. MySQL and SQLite undo the failed statement alone. So that a
//! failed guarded write leaves the caller's transaction usable on every backend, with
//! what it wrote before, a write in a transaction the caller controls runs under a
//! savepoint on PostgreSQL (as EF Core does for `SaveChanges` in an open transaction):
//! two more round trips, paid only there. Transactions the library opened for its own
//! statements (a read-modify-write, a claim, a lock) need none, since a failure ends
//! them anyway: the library says so with `own` when it sends a statement, on the
//! blocking and the async path alike. The closures it hands a connection to (a
//! transition hook, a protected write, a guarded operation) call the public API, whose
//! statements are the caller's.

use diesel::connection::Connection;
use diesel::QueryResult;

use crate::connect::backend::OccBackend;
use crate::connect::transaction::in_transaction;
use crate::connect::write_gate;

/// Runs the write statement `f` on `conn`; on PostgreSQL, inside a transaction the
/// caller controls (`own` false: the open transaction, if any, is not one the library
/// opened for its own statements), under a savepoint that a failure rolls back to. On SQLite, outside
/// any transaction, after this process's earlier writers
/// ([`write_gate`](crate::connect::write_gate)): without the queue, a writer that has
/// just written usually takes SQLite's lock again before the writers asleep in its busy
/// handler wake, and some of them starve. Inside a transaction the turn is its own
/// (the library's write transactions took theirs at `BEGIN`; the caller's are not in the
/// queue, and waiting there while holding SQLite's lock would hold up the queue).
pub(crate) fn protect_caller<C, T>(
    conn: &mut C,
    own: bool,
    f: impl FnOnce(&mut C) -> QueryResult<T>,
) -> QueryResult<T>
where
    C: Connection,
    C::Backend: OccBackend,
{
    if C::Backend::ONE_WRITER {
        if in_transaction(conn) {
            return f(conn);
        }
        let _turn = write_gate::wait_for_turn(write_gate::MAX_WAIT);
        return f(conn);
    }
    let callers = C::Backend::FAILURE_ABORTS_TRANSACTION && !own && in_transaction(conn);
    if callers {
        conn.transaction(f)
    } else {
        f(conn)
    }
}
