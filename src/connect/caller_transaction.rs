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
//! them anyway; the closures it hands a connection to (a transition hook, a protected
//! write, a guarded operation) are the caller's again.

use std::cell::Cell;

use diesel::connection::Connection;
use diesel::QueryResult;

use crate::connect::backend::OccBackend;
use crate::connect::write_gate;
use crate::write::executor::in_transaction;

thread_local! {
    /// The address of the connection whose open transaction this thread's library code
    /// opened for its own statements; 0 when there is none.
    static OWN: Cell<usize> = const { Cell::new(0) };
}

/// Puts the previous owner back when a scope ends, on unwinding too.
struct Restore(usize);

impl Drop for Restore {
    fn drop(&mut self) {
        OWN.with(|own| own.set(self.0));
    }
}

fn address<C>(conn: &C) -> usize {
    std::ptr::from_ref(conn) as usize
}

/// Whether `conn`'s open transaction is one the library opened for its own statements.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) fn in_own_transaction<C: Connection>(conn: &mut C) -> bool {
    OWN.with(|own| own.get()) == address(conn) && in_transaction(conn)
}

/// Runs `f` with `conn`'s open transaction marked as the library's own.
pub(crate) fn as_library<C, R>(conn: &mut C, f: impl FnOnce(&mut C) -> R) -> R {
    let _restore = Restore(OWN.with(|own| own.replace(address(conn))));
    f(conn)
}

/// Runs the caller's `f` inside a transaction of the library's: its statements are the
/// caller's again.
pub(crate) fn as_caller<C, R>(conn: &mut C, f: impl FnOnce(&mut C) -> R) -> R {
    let _restore = Restore(OWN.with(|own| own.replace(0)));
    f(conn)
}

/// Runs the write statement `f` on `conn`; on PostgreSQL, inside a transaction the
/// caller controls, under a savepoint that a failure rolls back to. On SQLite, outside
/// any transaction, after this process's earlier writers
/// ([`write_gate`](crate::connect::write_gate)): without the queue, a writer that has
/// just written usually takes SQLite's lock again before the writers asleep in its busy
/// handler wake, and some of them starve. Inside a transaction the turn is its own
/// (the library's write transactions took theirs at `BEGIN`; the caller's are not in the
/// queue, and waiting there while holding SQLite's lock would hold up the queue).
pub(crate) fn protect_caller<C, T>(
    conn: &mut C,
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
    let callers = C::Backend::FAILURE_ABORTS_TRANSACTION
        && OWN.with(|own| own.get()) != address(conn)
        && in_transaction(conn);
    if callers {
        conn.transaction(f)
    } else {
        f(conn)
    }
}
