//! What locks need from each backend: a transaction whose waits are bounded, and the
//! source of fencing tokens.
//!
//! Every statement of an acquisition, renewal or release waits at most a bound the lock
//! derives from its lease: a statement that waited longer would come back after the
//! holder's local deadline, when its answer no longer counts. Per backend:
//!
//! - PostgreSQL: `SET LOCAL lock_timeout` (row locks, the usual wait) and, as a backstop
//!   for other waits (a stalled disk), `SET LOCAL statement_timeout` at twice the bound.
//!   Both end with the transaction.
//! - MariaDB: `max_statement_time` for the transaction's statements (it interrupts row-lock
//!   waits too, with microsecond resolution; `innodb_lock_wait_timeout` has whole seconds
//!   only), set for the session around the transaction and restored after it.
//! - SQLite: `PRAGMA busy_timeout` around the transaction, restored after it, and the
//!   wait for this process's other SQLite writers to take their turns bounded the same.
//!
//! Fences come from a source that never goes back (migration `occ_fence_source`), not from
//! the lock row, which an operator may delete or truncate. On PostgreSQL they carry the
//! server's timeline as an epoch in their high bits, so that they keep rising across a
//! failover to a standby that lost the old primary's last commits.

use std::time::Duration;

use diesel::connection::{LoadConnection, SimpleConnection};
use diesel::query_builder::{AstPass, QueryFragment, QueryId};
use diesel::{Column, QueryResult};

use crate::connect::backend::OccBackend;
use crate::connect::transaction::WriteTransaction;
use crate::error::Error;
use crate::guard::server_clock::ServerClock;

/// A backend locks run on.
pub trait LockBackend: OccBackend + ServerClock {
    /// Runs `f` in a write transaction on `conn` bounded to about `bound`: the session
    /// settings of [`wait_bounds`](Self::wait_bounds) around it (SQLite: its busy
    /// timeout and its writers' turn). The setting inside the transaction is `f`'s to
    /// send first, and its errors `f`'s to judge with
    /// [`bounded_error`](Self::bounded_error): the lock's flow does both, for both
    /// drivers.
    #[doc(hidden)]
    fn bounded<C, T>(
        conn: &mut C,
        bound: Duration,
        f: impl FnOnce(&mut C) -> Result<T, Error>,
    ) -> Result<T, Error>
    where
        C: WriteTransaction<Backend = Self> + SimpleConnection + LoadConnection;

    /// Pushes the next value of the fence source.
    #[doc(hidden)]
    fn push_next_fence(out: &mut AstPass<'_, '_, Self>);

    /// The settings that bound every wait of a lock's transaction to about `bound`, on a
    /// server backend (SQLite's bounds are its own [`bounded`](Self::bounded)'s).
    #[doc(hidden)]
    fn wait_bounds(bound: Duration) -> WaitBounds {
        let _ = bound;
        WaitBounds::default()
    }

    /// The error of a statement of a bounded transaction (never its `COMMIT`), as the
    /// lock reports it.
    #[doc(hidden)]
    fn bounded_error(error: Error) -> Error {
        error
    }

    /// Whether a grant is read back after its `COMMIT` before it is believed. MariaDB
    /// Galera can abort a transaction for a conflicting write from another node and still
    /// answer its statements with success (a known fault of its prepared-statement
    /// protocol after such an abort), so the `COMMIT` that follows ends no transaction
    /// and the grant it reports never happened: seen in the cluster tests as a fence whose
    /// row, read at once on the same node, already held the next grant's.
    #[doc(hidden)]
    const CONFIRMS_GRANTS: bool = false;

    /// Whether [`draw_fence`](Self::draw_fence) sends anything: a fence is drawn before
    /// the acquisition that uses it.
    #[doc(hidden)]
    const DRAWS_FENCE: bool = false;

    /// Prepares [`push_next_fence`](Self::push_next_fence) in the transaction of the
    /// statement that uses it (SQLite draws the value into `last_insert_rowid()`).
    #[doc(hidden)]
    fn draw_fence<C: SimpleConnection>(conn: &mut C) -> QueryResult<()> {
        let _ = conn;
        Ok(())
    }
}

/// What the flow of a lock's write needs to know of backend `DB`.
pub(crate) fn facts<DB: LockBackend>() -> crate::flow::lock_transaction::LockFacts {
    crate::flow::lock_transaction::LockFacts {
        duplicates: DB::DUPLICATES,
        draws_fence: DB::DRAWS_FENCE,
        confirms_grants: DB::CONFIRMS_GRANTS,
    }
}

/// [`LockBackend::bounded`] on a server backend, as the async path runs it too: the
/// settings of [`LockBackend::wait_bounds`] before `BEGIN` and restored after whatever the
/// outcome, around a transaction of the library's (the setting sent first inside it is
/// the lock's first statement, see `lock_io`).
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn on_server<C, T>(
    conn: &mut C,
    bound: Duration,
    f: impl FnOnce(&mut C) -> Result<T, Error>,
) -> Result<T, Error>
where
    C: WriteTransaction + SimpleConnection,
    C::Backend: LockBackend,
{
    let bounds = C::Backend::wait_bounds(bound);
    if let Some(before) = &bounds.before {
        conn.batch_execute(before)?;
    }
    let result = crate::connect::transaction::commit_operation(conn, f);
    match &bounds.after {
        Some(after) => restore_after(conn, after, result),
        None => result,
    }
}

/// How long each statement of a lock call bounded to `bound` (a third of its TTL) waits
/// for its reply on a watched connection ([`PoolConfig::reply_timeout`](crate::PoolConfig))
/// before the connection is closed: past the server's own bounds (at most twice
/// `bound`) by a second where the TTL leaves room, so that a server that answers reports
/// its timeout itself, and never past the TTL, so that a frozen server does not hold a
/// statement past the lease it computes.
pub(crate) fn reply_limit(bound: Duration) -> Duration {
    (bound * 2 + Duration::from_secs(1)).min(bound * 3)
}

/// `bound` in whole milliseconds, at least one.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
fn millis(bound: Duration) -> u128 {
    bound.as_millis().max(1)
}

/// Runs `restore` (a session setting changed for the transaction) whatever the
/// transaction's `result`, and answers `result`. A committed grant stays a grant when the
/// restore then fails: the connection died right after the commit (the pool discards
/// it), and reporting a failure would hide a lock this holder took.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
fn restore_after<C: SimpleConnection, T>(
    conn: &mut C,
    restore: &str,
    result: Result<T, Error>,
) -> Result<T, Error> {
    let _ = conn.batch_execute(restore);
    result
}

#[cfg(feature = "postgres")]
impl LockBackend for diesel::pg::Pg {
    fn wait_bounds(bound: Duration) -> WaitBounds {
        let ms = millis(bound);
        WaitBounds {
            inside: Some(format!(
                "SET LOCAL lock_timeout = {ms}; SET LOCAL statement_timeout = {}",
                2 * ms
            )),
            ..WaitBounds::default()
        }
    }

    fn bounded_error(error: Error) -> Error {
        statement_timeout_is_a_lock_timeout(error)
    }

    fn bounded<C, T>(
        conn: &mut C,
        bound: Duration,
        f: impl FnOnce(&mut C) -> Result<T, Error>,
    ) -> Result<T, Error>
    where
        C: WriteTransaction<Backend = Self> + SimpleConnection + LoadConnection,
    {
        on_server(conn, bound, f)
    }

    fn push_next_fence(out: &mut AstPass<'_, '_, Self>) {
        // The server's timeline above the sequence's value: a promoted standby starts a
        // new, higher timeline, so its fences exceed every fence the old primary handed
        // out, including those lost with its last unreplicated commits (the sequence
        // alone may repeat them). The timeline is the first 8 hex digits of the current
        // WAL file's name; migration `occ_fence_epoch` keeps the sequence below 2^44.
        out.push_sql(
            "(('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint << 44) \
             + nextval('occ_fence_source')",
        );
    }
}

/// The `statement_timeout` set above is this bound running out, like `lock_timeout`: a
/// row lock can take two waits (for the tuple lock among other waiters, then for its
/// holder), each under `lock_timeout` and together over the statement's bound. So it is
/// retryable here, though a statement timeout elsewhere is not (it would time out again).
///
/// A cancel without a named timeout (`57014` "due to user request") is this bound too, or
/// an operator's `pg_cancel_backend`: PostgreSQL reports a timeout that fired as its
/// statement was ending on the next statement, with its reason already cleared. Either
/// way the transaction rolled back and granted nothing, so it is retryable as well.
#[cfg(feature = "postgres")]
fn statement_timeout_is_a_lock_timeout(error: Error) -> Error {
    const CANCELLED: [&str; 2] = [
        "canceling statement due to statement timeout",
        "canceling statement due to user request",
    ];
    match error {
        Error::Database(source @ diesel::result::Error::DatabaseError(_, _))
            if matches!(&source, diesel::result::Error::DatabaseError(_, info)
                if CANCELLED.contains(&info.message())) =>
        {
            Error::Retryable {
                reason: crate::RetryReason::LockTimeout,
                source,
            }
        }
        other => other,
    }
}

#[cfg(feature = "mysql")]
impl LockBackend for diesel::mysql::Mysql {
    fn wait_bounds(bound: Duration) -> WaitBounds {
        WaitBounds {
            before: Some(format!(
                "SET @diesel_occ_statement_time = @@SESSION.max_statement_time, \
                 SESSION max_statement_time = {:.6}",
                bound.max(Duration::from_micros(1)).as_secs_f64()
            )),
            after: Some("SET SESSION max_statement_time = @diesel_occ_statement_time".into()),
            ..WaitBounds::default()
        }
    }

    fn bounded<C, T>(
        conn: &mut C,
        bound: Duration,
        f: impl FnOnce(&mut C) -> Result<T, Error>,
    ) -> Result<T, Error>
    where
        C: WriteTransaction<Backend = Self> + SimpleConnection + LoadConnection,
    {
        on_server(conn, bound, f)
    }

    fn push_next_fence(out: &mut AstPass<'_, '_, Self>) {
        out.push_sql("NEXTVAL(occ_fence_source)");
    }

    const CONFIRMS_GRANTS: bool = true;
}

#[cfg(feature = "sqlite")]
impl LockBackend for diesel::sqlite::Sqlite {
    fn bounded<C, T>(
        conn: &mut C,
        bound: Duration,
        f: impl FnOnce(&mut C) -> Result<T, Error>,
    ) -> Result<T, Error>
    where
        C: WriteTransaction<Backend = Self> + SimpleConnection + LoadConnection,
    {
        use diesel::RunQueryDsl;
        let previous = diesel::select(diesel::dsl::sql::<diesel::sql_types::Integer>(
            "(SELECT timeout FROM pragma_busy_timeout)",
        ))
        .get_result::<i32>(conn)?;
        conn.batch_execute(&format!("PRAGMA busy_timeout = {}", millis(bound)))?;
        let result = crate::connect::transaction::commit_operation_within(conn, bound, f);
        restore_after(conn, &format!("PRAGMA busy_timeout = {previous}"), result)
    }

    fn push_next_fence(out: &mut AstPass<'_, '_, Self>) {
        out.push_sql("last_insert_rowid()");
    }

    const DRAWS_FENCE: bool = true;

    fn draw_fence<C: SimpleConnection>(conn: &mut C) -> QueryResult<()> {
        // One row, replaced: its AUTOINCREMENT id never repeats, even after a delete.
        conn.batch_execute("REPLACE INTO occ_fence_source (slot) VALUES (0)")
    }
}

/// The statements that bound a lock transaction's waits on a server backend, for the
/// transactions the async path sends itself (the blocking path sends the same).
#[doc(hidden)]
#[derive(Debug, Default)]
pub struct WaitBounds {
    /// Sent before `BEGIN` (a session setting).
    pub before: Option<String>,
    /// Sent first inside the transaction (a transaction-local setting).
    pub inside: Option<String>,
    /// Sent after the transaction ended, whatever its outcome (restores `before`).
    pub after: Option<String>,
}

/// A server backend, whose lock transactions are bounded by settings (see
/// [`LockBackend::wait_bounds`]): what the async path runs locks on. Not a trait to
/// implement.
pub trait ServerLockBackend: LockBackend {}

#[cfg(feature = "postgres")]
impl ServerLockBackend for diesel::pg::Pg {}

#[cfg(feature = "mysql")]
impl ServerLockBackend for diesel::mysql::Mysql {}

/// `"fence" = GREATEST("fence" + 1, <next of the fence source>)`: above the row's own
/// fence and above every fence the source handed out, so it rises even when the row was
/// deleted and created again.
#[derive(Debug, Clone, Copy, Default)]
pub struct NextFence<Col>(std::marker::PhantomData<Col>);

impl<Col: Column, DB: LockBackend> QueryFragment<DB> for NextFence<Col> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_identifier(Col::NAME)?;
        out.push_sql(&format!(" = {}(", DB::GREATEST));
        out.push_identifier(Col::NAME)?;
        out.push_sql(" + 1, ");
        DB::push_next_fence(&mut out);
        out.push_sql(")");
        Ok(())
    }
}

impl<Col> QueryId for NextFence<Col> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}
