//! The one error type of diesel-occ.
//!
//! A guarded write that matches no row is not a generic database failure: it is one of a
//! few precise outcomes (the row is gone, someone else changed it, the transition is not
//! allowed, a lock was lost). Each gets its own variant so callers can `match` on what
//! happened and decide what to do, and each message says what to do next.

use std::any::Any;
use std::fmt;

use diesel::result::{DatabaseErrorKind, Error as DieselError};

mod transient;

pub(crate) use transient::retry_reason_of;

/// Everything that can go wrong in diesel-occ.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The row addressed by the key does not exist (any more).
    #[error("no row in `{table}` with key {key}: it was deleted or never existed; reload the list or report 404")]
    NotFound {
        /// The table that was written.
        table: &'static str,
        /// The key that was looked for, rendered with `Debug`.
        key: String,
    },

    /// Someone else changed the row since the caller read it; nothing was written.
    #[error("{0}")]
    Conflict(Box<Conflict>),

    /// An insert found its key taken: the row there (take it out with
    /// `current.as_any().downcast_ref::<Entity>()`). Nothing was written.
    #[error("`{table}` already has a row with key {key}: nothing was written; load it and update it instead")]
    AlreadyExists {
        /// The table that was written.
        table: &'static str,
        /// The key, rendered with `Debug`.
        key: String,
        /// The row that holds the key.
        current: Box<dyn CurrentRow>,
    },

    /// The row is in a state from which the requested transition is not allowed (someone
    /// else moved it first: cancel beat ship); nothing was written. Carries the current row.
    #[error("{0}")]
    InvalidTransition(Box<InvalidTransition>),

    /// The lock is held by another holder, whose lease has not ended.
    #[error("lock `{lock}` is held by {} until {}; try again later or wait for it", .holder.as_deref().unwrap_or("another holder"), .until.as_deref().unwrap_or("its lease ends"))]
    LockHeld {
        /// The lock's name and resource.
        lock: String,
        /// The holder's label, if it gave one.
        holder: Option<String>,
        /// When its lease ends (database clock, UTC).
        until: Option<String>,
    },

    /// The caller no longer holds the lock or lease it thinks it holds (it expired or was
    /// taken over); whatever it protects must not be written any more.
    #[error("lock `{lock}` is no longer held by this owner ({why}); stop the work it protects")]
    LockLost {
        /// The lock's name and resource.
        lock: String,
        /// What happened: taken over (by whom, with which fence), the lease ended, no
        /// renewal came back before the holder's local deadline, ...
        why: String,
    },

    /// A write carried a fencing token older than the newest one handed out.
    #[error("fencing token {presented} is stale (the newest is {current}); the writer lost its lease and must stop")]
    StaleFence {
        /// The token the writer presented.
        presented: i64,
        /// The newest token.
        current: i64,
    },

    /// A retry policy gave up; `last` is the error of the final attempt.
    #[error("gave up after {attempts} attempts; last error: {last}")]
    RetriesExhausted {
        /// How many attempts were made.
        attempts: u32,
        /// The error of the last attempt.
        last: Box<Error>,
    },

    /// The database refused the statement for a transient reason (serialization failure,
    /// deadlock, lock wait timeout, SQLite busy). Roll back the whole transaction and run
    /// it again from its first read: that is safe, and it is required. A deadlock or a
    /// serialization failure rolls the transaction back already, but after a lock wait
    /// timeout MySQL / MariaDB undo only the failed statement and keep the transaction's
    /// earlier writes, and PostgreSQL leaves the transaction aborted. Outside a
    /// transaction the failed statement wrote nothing.
    #[error("transient database error ({reason}): roll back and run the transaction again from its first read: {source}")]
    Retryable {
        /// Why the database refused.
        reason: RetryReason,
        /// The error the database returned.
        source: DieselError,
    },

    /// The connection failed while a write or commit was in flight: the write may or may
    /// not have been applied. Never retried automatically (an increment would apply twice).
    #[error("the connection failed while a write was in flight; it may or may not have been applied: read the row before deciding: {source}")]
    Ambiguous {
        /// The error the connection returned.
        source: DieselError,
    },

    /// The token cannot advance: a version column already holds the largest value of its
    /// type. Nothing was written.
    #[error("`{table}` row {key} is at {current}, the largest its column can hold; widen the column (BIGINT) or reset it: nothing was written")]
    VersionOverflow {
        /// The table that was written.
        table: &'static str,
        /// The key of the row.
        key: String,
        /// The token the row holds.
        current: Token,
    },

    /// A guarded write matched more than one row: the key the entity declares does not
    /// identify a single row. Check `#[diesel(primary_key(...))]` against the table.
    /// The statement was executed: roll back your transaction, if any, to undo it.
    #[error("a guarded write on `{table}` with key {key} matched {rows} rows and was applied to all of them (roll back to undo); the declared primary key does not identify one row")]
    KeyNotUnique {
        /// The table that was written.
        table: &'static str,
        /// The key used.
        key: String,
        /// How many rows matched.
        rows: usize,
    },

    /// The write matched no row although the row is still at the token the caller
    /// expected: the database refused or ignored it. A `BEFORE UPDATE` trigger that skips
    /// the row (PostgreSQL `RETURN NULL`, SQLite `RAISE(IGNORE)`), a rule, a row-level
    /// security policy that hides the row from `UPDATE` but not from `SELECT`, or a stored
    /// token the Rust type cannot represent (SQLite keeps 32768 in a SMALLINT column, read
    /// as `i16` it is -32768). Nobody else won, so running it again cannot succeed.
    #[error("the write to `{table}` row {key} matched no row although the row is still at {token}: the database refused or ignored it (a trigger, rule or row-level security policy, or a stored token out of the field type's range); retrying cannot help, nothing was written")]
    Refused {
        /// The table that was written.
        table: &'static str,
        /// The key of the row.
        key: String,
        /// The token the row has, equal to the expected one.
        token: Token,
    },

    /// The changeset assigns a column that the guard itself sets (the version, say). The
    /// statement would be invalid on PostgreSQL and would silently drop one of the two
    /// values elsewhere, so it is refused before anything is sent.
    #[error("the changeset for `{table}` assigns `{column}`, which the guard sets itself; leave it out of the changeset (for an `AsChangeset` struct: `#[diesel(skip_update)]` on that field): nothing was written")]
    ChangesetAssignsGuard {
        /// The table that was written.
        table: &'static str,
        /// The column assigned twice, as the SQL names it.
        column: String,
    },

    /// A write meant for excluded fields only (`update_excluded`) assigns a column the
    /// guard protects. Nothing was written.
    #[error("the changeset for `{table}` assigns `{column}`, which is not an `#[occ(exclude)]` field: write it with a guarded update, or exclude the field: nothing was written")]
    NotExcluded {
        /// The table that was written.
        table: &'static str,
        /// The column that is not excluded, by its SQL name.
        column: String,
    },

    /// A write that is not a transition would change the `#[occ(status)]` column: a
    /// changeset that assigns it, or a saved copy whose state differs from the row's.
    /// Only transitions move it, so the allowed moves cannot be walked around; nothing
    /// was written.
    #[error("`{column}` of `{table}` is moved only by transitions, and this write would change it ({detail}): use `transition` or `transition_by_key` (`force_status` to repair data): nothing was written")]
    StatusNotWritable {
        /// The table that was written.
        table: &'static str,
        /// The status column, by its SQL name.
        column: String,
        /// How the write would have changed it.
        detail: String,
    },

    /// A stored value cannot be used as it is (malformed JSON, a NULL where a token is
    /// required, ...); nothing was written.
    #[error("invalid stored data in `{table}`.`{column}`: {reason}; nothing was written")]
    InvalidData {
        /// The table read.
        table: &'static str,
        /// The column (or columns, comma-separated) read.
        column: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A JSON edit cannot be applied to the document (a patch of the wrong shape, a path
    /// into a scalar, a failed JSON Patch `test`, a result over the size limit); nothing
    /// was written.
    #[error(
        "cannot apply the edit to `{table}`.`{column}` of row {key}: {reason}; nothing was written"
    )]
    InvalidPatch {
        /// The table of the document.
        table: &'static str,
        /// The key of the row.
        key: String,
        /// The JSON column.
        column: &'static str,
        /// What is wrong.
        reason: String,
    },

    /// A name (a lock's, a resource's) cannot be stored as it is: too long, empty, or
    /// holding a NUL. Refused before anything is sent, so two names never become one.
    #[error("invalid {what} {name:?}: {reason}")]
    InvalidName {
        /// What the name is for ("lock name", "resource").
        what: &'static str,
        /// The name, cut to its first 64 characters.
        name: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A setting is out of its range (a zero or day-long lease, ...); nothing was sent.
    #[error("invalid {what}: {reason}")]
    InvalidSetting {
        /// What the setting is.
        what: &'static str,
        /// What is wrong with it.
        reason: String,
    },

    /// The table does not fit the entity's declaration as the guard needs (a time column
    /// that keeps fewer digits than the guard's tokens carry); nothing was written.
    #[error("`{table}`.`{column}` does not fit its guard: {reason}; nothing was written")]
    SchemaMismatch {
        /// The table.
        table: &'static str,
        /// The column, by its SQL name.
        column: String,
        /// What does not fit, and the attribute or column type that makes it fit.
        reason: String,
    },

    /// One of the library's own tables (`occ_locks`, `occ_versions`, `occ_transitions`)
    /// does not exist: its migrations were not run on this database.
    #[error("diesel-occ's table `{table}` does not exist in this database: run `diesel_occ::migrations::run(&mut conn)` once (or apply migrations/diesel_occ/<backend>/ with the diesel CLI) before using locks, version rows or the transition history: {source}")]
    MissingTable {
        /// The missing table.
        table: &'static str,
        /// The database's own report.
        #[source]
        source: DieselError,
    },

    /// The server refused a write because it accepts none: a PostgreSQL hot standby, a
    /// MySQL / MariaDB replica with `read_only`, or a transaction opened `READ ONLY`.
    /// Nothing was written; retrying on the same connection cannot help, so it is not
    /// retryable: send the write to the primary (after a failover, to the new one).
    /// Operations that take a pooled connection per attempt retry it on a new one
    /// ([`RetryReason::ReadOnly`]); a pool of the library's discards a connection that
    /// met a read-only server, so that the next checkout connects again.
    #[error("the server is read-only (a standby or replica, or a READ ONLY transaction) and refused the write: send writes to the primary; nothing was written: {source}")]
    ReadOnly {
        /// The database's own report (PostgreSQL `25006`, MySQL `1792` or `1290` for
        /// `--read-only`).
        #[source]
        source: DieselError,
    },

    /// The server had no prepared statement by the name the client sent, or already had
    /// one: a connection pooler in transaction mode ran the statement on another server
    /// session than the one it was prepared on (PgBouncer before 1.21, or with
    /// `max_prepared_statements = 0`). This statement did not run; what earlier statements
    /// committed stays. A blocking connection works there with diesel's statement
    /// cache turned off (`PoolConfig::statement_cache`, or
    /// `set_prepared_statement_cache_size(CacheSize::Disabled)`); diesel-async's
    /// PostgreSQL connection always names its statements and needs PgBouncer 1.21 or newer
    /// with `max_prepared_statements` above 0 (the default from 1.24), or session pooling. Not retryable: the next
    /// attempt would fail the same way whenever it meets another session.
    #[error("the server session does not hold the prepared statement the client made: a pooler in transaction mode ran it on another session (PgBouncer before 1.21, or max_prepared_statements = 0); turn diesel's statement cache off (PoolConfig::statement_cache) or set PgBouncer's max_prepared_statements; this statement did not run: {source}")]
    StatementLostByPooler {
        /// The server's report (PostgreSQL `26000` or `42P05`).
        #[source]
        source: DieselError,
    },

    /// A conditional HTTP request refused before any write (feature `http`): a malformed
    /// `If-Match`, one required and missing, or one naming no current representation. A
    /// handler that returns `Result<_, Error>` can `?` the library's writes and its
    /// precondition checks alike; [`Problem`](crate::http::Problem) answers it as 400, 428
    /// or 412.
    #[cfg(feature = "http")]
    #[error("{0}")]
    Precondition(#[from] crate::http::HttpError),

    /// The library's migrations could not be applied.
    #[error("cannot apply diesel-occ's migrations: {0}")]
    Migration(#[source] Box<dyn std::error::Error + Send + Sync>),

    /// Any other database error.
    #[error("database error: {0}")]
    Database(#[source] DieselError),

    /// The connection could not be established.
    #[error("cannot connect to the database: {0}")]
    Connection(#[from] diesel::ConnectionError),

    /// The pool could not hand out a connection (in its time, or at all): the pool's own
    /// error (`r2d2::Error`, deadpool's `PoolError`, ...) is the source.
    #[error("no pooled connection available: {0}")]
    Pool(#[source] Box<dyn std::error::Error + Send + Sync>),

    /// A JSON value could not be read or written.
    #[error("JSON error: {0}")]
    Json(#[from] serde_json::Error),
}

/// Why the database refused a statement in a way that a fresh attempt can fix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RetryReason {
    /// PostgreSQL `40001` under REPEATABLE READ / SERIALIZABLE.
    SerializationFailure,
    /// PostgreSQL `40P01`, MySQL `1213`.
    Deadlock,
    /// MySQL `1205`, PostgreSQL `55P03` (lock not available).
    LockTimeout,
    /// SQLite `SQLITE_BUSY` / `SQLITE_LOCKED` after the busy timeout.
    Busy,
    /// The connection died (or was closed by its reply timeout) before the `COMMIT` of a
    /// transaction the library opened, so nothing was written. Only for operations that
    /// take a new connection from a pool for each attempt
    /// ([`modify_pooled`](crate::GuardedModify::modify_pooled), the calls of
    /// [`Locks`](crate::Locks)); on a single connection the next attempt would find it
    /// dead too.
    ConnectionLost,
    /// MariaDB `1047` on a Galera node outside the cluster's primary component (restarted
    /// and not yet synced, cut off from the others): it runs no statement until it has
    /// caught up, so nothing was written. Another node, or this one a moment later, can
    /// take the next attempt.
    NodeNotReady,
    /// The row a missed write was explained by is older than the copy the write carried:
    /// the server that answered had not yet applied a commit the caller had already seen
    /// (a replica, or a Galera node read without causal reads), or lost it in a failover.
    /// Nothing was written. Once the server has caught up, a fresh attempt can succeed;
    /// a copy of a commit a failover lost stays ahead for good, and the retry policy's
    /// bound ends it.
    ReadBehind,
    /// The server refused the write as read-only ([`Error::ReadOnly`]): nothing was
    /// written. Only for operations that take a new connection from a pool for each
    /// attempt, on PostgreSQL and MySQL / MariaDB: the connection that met the read-only
    /// server is discarded, and the pool's next one may reach the primary (a standby
    /// still finishing its promotion behind a proxy, a multi-host URL with
    /// `target_session_attrs=read-write`). A server that stays read-only ends at the retry
    /// policy's bound, with `ReadOnly` as its last error. Such a retry waits at least
    /// 250 ms: each attempt costs a connect.
    ReadOnly,
}

impl fmt::Display for RetryReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RetryReason::SerializationFailure => "serialization failure",
            RetryReason::Deadlock => "deadlock",
            RetryReason::LockTimeout => "lock wait timeout",
            RetryReason::Busy => "database busy",
            RetryReason::ConnectionLost => "connection lost before the commit",
            RetryReason::NodeNotReady => "cluster node not ready",
            RetryReason::ReadBehind => "the server's row is older than the caller's copy",
            RetryReason::ReadOnly => "the server was read-only",
        })
    }
}

/// The token a guard compared, for messages and for callers that merge.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Token {
    /// A version number (signed or unsigned 16, 32 and 64 bit columns, widened).
    Version(i128),
    /// A last-modified timestamp, as UTC with microseconds.
    Timestamp(String),
    /// The compared columns' values of a pre-image guard, rendered with `Debug`.
    PreImage(String),
    /// A PostgreSQL row version (`xmin`, the id of the transaction that wrote the row).
    RowVersion(u32),
    /// A value the database maintains (`#[occ(row_version)]`): bytes in hexadecimal,
    /// other values as written.
    RowValue(String),
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Token::Version(v) => write!(f, "version {v}"),
            Token::Timestamp(t) => write!(f, "last modified {t}"),
            Token::PreImage(values) => write!(f, "values {values}"),
            Token::RowVersion(xmin) => write!(f, "row version (xmin) {xmin}"),
            Token::RowValue(value) => write!(f, "row version {value}"),
        }
    }
}

/// A row value that a [`Conflict`] can carry without making [`Error`] generic.
pub trait CurrentRow: Any + fmt::Debug + Send + Sync {
    /// Upcast for downcasting to the entity type.
    fn as_any(&self) -> &dyn Any;
    /// Upcast for taking the entity out.
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
}

impl<T: Any + fmt::Debug + Send + Sync> CurrentRow for T {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

/// A transition the row does not allow: its current state (`from`) cannot move to `to`,
/// or, for a transition with a condition, the row does not meet it (`unmet`). Carries the
/// current row, as a [`Conflict`] does.
#[derive(Debug)]
pub struct InvalidTransition {
    /// The table that was written.
    pub table: &'static str,
    /// The key of the row, rendered with `Debug`.
    pub key: String,
    /// The state the row is in now.
    pub from: String,
    /// The state that was asked for.
    pub to: String,
    /// The transition's condition, as SQL, when the state allowed the move but the row
    /// does not meet the condition; `None` when the state itself does not allow it.
    pub unmet: Option<String>,
    current: Box<dyn CurrentRow>,
}

impl fmt::Display for InvalidTransition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (table, key, from, to) = (self.table, &self.key, &self.from, &self.to);
        match &self.unmet {
            None => write!(
                f,
                "`{table}` row {key} is `{from}`, so it cannot become `{to}`; nothing was written"
            ),
            Some(condition) => write!(
                f,
                "`{table}` row {key} is `{from}` but does not meet `{condition}`, so it cannot \
                 become `{to}`; nothing was written"
            ),
        }
    }
}

impl std::error::Error for InvalidTransition {}

impl InvalidTransition {
    /// The refusal of a move to `to` for `current`, which is in state `from`.
    pub fn new<T: CurrentRow>(
        table: &'static str,
        key: String,
        from: String,
        to: String,
        current: T,
    ) -> Self {
        InvalidTransition {
            table,
            key,
            from,
            to,
            unmet: None,
            current: Box::new(current),
        }
    }

    /// The same refusal, for a row that does not meet the transition's `unmet` condition.
    pub fn with_unmet(self, unmet: Option<String>) -> Self {
        InvalidTransition { unmet, ..self }
    }

    /// The current row, if it is a `T`.
    pub fn current<T: 'static>(&self) -> Option<&T> {
        (*self.current).as_any().downcast_ref()
    }
}

/// Someone else wrote the row between the caller's read and its write.
///
/// Carries the row as it is now, so the caller can show it, merge into it or re-apply its
/// change without another round trip. Take it out with [`Conflict::current`] or
/// [`Conflict::into_current`] using the entity type that was written.
#[derive(Debug)]
pub struct Conflict {
    /// The table that was written.
    pub table: &'static str,
    /// The key of the row, rendered with `Debug`.
    pub key: String,
    /// The token the caller's copy had.
    pub expected: Token,
    /// The token the row has now.
    pub found: Token,
    current: Box<dyn CurrentRow>,
}

impl Conflict {
    /// A conflict on `table`/`key` whose current row is `current`.
    pub fn new<T: CurrentRow>(
        table: &'static str,
        key: String,
        expected: Token,
        found: Token,
        current: T,
    ) -> Self {
        Conflict {
            table,
            key,
            expected,
            found,
            current: Box::new(current),
        }
    }

    /// The current row, if it is a `T`.
    pub fn current<T: 'static>(&self) -> Option<&T> {
        // Deref first: the `Box` itself is a `CurrentRow` too.
        (*self.current).as_any().downcast_ref()
    }

    /// Takes the current row out; gives the conflict back if it is not a `T`. Takes the
    /// box [`Error::Conflict`] holds, so the conflict is never copied.
    pub fn into_current<T: 'static>(self: Box<Self>) -> Result<T, Box<Self>> {
        if (*self.current).as_any().is::<T>() {
            let any = self.current.into_any();
            Ok(*any.downcast::<T>().expect("type checked just above"))
        } else {
            Err(self)
        }
    }
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` row {} was changed by someone else (expected {}, found {}); nothing was written: \
             re-apply your change to the current row and save again",
            self.table, self.key, self.expected, self.found
        )
    }
}

impl From<r2d2::Error> for Error {
    fn from(error: r2d2::Error) -> Self {
        Error::Pool(Box::new(error))
    }
}

impl Error {
    /// [`Error::Pool`] from any pool's error, or from a message.
    pub fn pool(source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Error::Pool(source.into())
    }

    /// A short name of what this error is (`"conflict"`, `"not_found"`,
    /// `"retries_exhausted"`, ...): the `outcome` of the library's telemetry, stable across
    /// releases, fit for a log field or a metric label.
    pub fn kind(&self) -> &'static str {
        match self {
            #[cfg(feature = "http")]
            Error::Precondition(_) => "precondition",
            Error::NotFound { .. } => "not_found",
            Error::Conflict(_) => "conflict",
            Error::AlreadyExists { .. } => "already_exists",
            Error::InvalidTransition(_) => "invalid_transition",
            Error::LockHeld { .. } => "lock_held",
            Error::LockLost { .. } => "lock_lost",
            Error::StaleFence { .. } => "stale_fence",
            Error::RetriesExhausted { .. } => "retries_exhausted",
            Error::Retryable { .. } => "retryable",
            Error::Ambiguous { .. } => "ambiguous",
            Error::VersionOverflow { .. } => "version_overflow",
            Error::KeyNotUnique { .. } => "key_not_unique",
            Error::Refused { .. } => "refused",
            Error::ChangesetAssignsGuard { .. } => "changeset_assigns_guard",
            Error::NotExcluded { .. } => "not_excluded",
            Error::StatusNotWritable { .. } => "status_not_writable",
            Error::InvalidData { .. } => "invalid_data",
            Error::InvalidPatch { .. } => "invalid_patch",
            Error::InvalidName { .. } => "invalid_name",
            Error::InvalidSetting { .. } => "invalid_setting",
            Error::SchemaMismatch { .. } => "schema_mismatch",
            Error::MissingTable { .. } => "missing_table",
            Error::ReadOnly { .. } => "read_only",
            Error::StatementLostByPooler { .. } => "statement_lost_by_pooler",
            Error::Migration(_) => "migration",
            Error::Database(_) => "database",
            Error::Connection(_) => "connection",
            Error::Pool(_) => "pool",
            Error::Json(_) => "json",
        }
    }

    /// Whether this error says the database or the network failed the call (a lost
    /// connection, no pooled connection, retries that ran out, stored data that cannot
    /// be read), rather than what the rows are (a conflict, a missing row, a held lock):
    /// what an operator is told of, at the `WARN` level of the library's telemetry.
    #[cfg_attr(not(feature = "tracing"), allow(dead_code))]
    pub(crate) fn is_trouble(&self) -> bool {
        matches!(
            self,
            Error::RetriesExhausted { .. }
                | Error::Ambiguous { .. }
                | Error::KeyNotUnique { .. }
                | Error::InvalidData { .. }
                | Error::SchemaMismatch { .. }
                | Error::MissingTable { .. }
                | Error::ReadOnly { .. }
                | Error::StatementLostByPooler { .. }
                | Error::Migration(_)
                | Error::Database(_)
                | Error::Connection(_)
                | Error::Pool(_)
        )
    }

    /// True when running the whole operation again from its first read may succeed:
    /// a conflict or a transient database refusal. Never true for [`Error::Ambiguous`].
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Conflict(_) | Error::Retryable { .. })
    }

    /// The conflict, if this is one.
    pub fn as_conflict(&self) -> Option<&Conflict> {
        match self {
            Error::Conflict(c) => Some(c),
            _ => None,
        }
    }

    /// Classifies an error of a statement that writes (or commits). When the connection
    /// dies outside a transaction the statement may have been applied: that is
    /// [`Error::Ambiguous`]. Inside a transaction the database rolls back, so it is not.
    pub fn from_write(source: DieselError, in_transaction: bool) -> Self {
        if !in_transaction && connection_lost(&source) {
            Error::Ambiguous { source }
        } else {
            Error::from(source)
        }
    }

    /// `source` as [`Error::Retryable`] when `retry_reason` names a reason, else as
    /// [`Error::Database`].
    pub(crate) fn classified(
        source: DieselError,
        retry_reason: impl FnOnce(&DieselError) -> Option<RetryReason>,
    ) -> Self {
        if read_only_refusal(&source) {
            return Error::ReadOnly { source };
        }
        if statement_lost_by_pooler(&source) {
            return Error::StatementLostByPooler { source };
        }
        match retry_reason(&source) {
            Some(reason) => Error::Retryable { reason, source },
            None => Error::Database(source),
        }
    }
}

impl From<DieselError> for Error {
    /// Classifies by diesel's error kind and the servers' fixed message texts
    /// (see [`RetryReason`]). diesel-occ's own statements classify more precisely, asking
    /// the server where the kind is not enough ([`OccBackend::retry_reason`](crate::OccBackend::retry_reason)).
    fn from(source: DieselError) -> Self {
        Error::classified(source, retry_reason_of)
    }
}

/// `error` and each of its sources, joined by `: `: diesel's deserialization errors name
/// the field in their own text and keep the value's problem in their source.
pub(crate) fn with_sources(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The library table `error` reports missing, if it is one: PostgreSQL's `relation "t"
/// does not exist`, MySQL's `Table 'db.t' doesn't exist`, SQLite's `no such table: t`.
pub(crate) fn missing_library_table(error: &DieselError) -> Option<&'static str> {
    let DieselError::DatabaseError(_, info) = error else {
        return None;
    };
    let message = info.message();
    [
        "occ_locks",
        "occ_versions",
        "occ_transitions",
        "occ_fence_source",
    ]
    .into_iter()
    .find(|table| {
        message == format!("relation \"{table}\" does not exist")
            || message == format!("no such table: {table}")
            || (message.starts_with("Table '")
                && message.ends_with(&format!(".{table}' doesn't exist")))
    })
}

/// Whether `error` is a read-only server's or transaction's refusal of a write. diesel
/// maps PostgreSQL's `25006` and MySQL's `1792` (a `READ ONLY` transaction) to
/// `ReadOnlyTransaction`. A server started or set `read_only` answers `1290`, which
/// MySQL and MariaDB use for every option that prevents a statement, so the option's
/// name in its text (kept as it is in every message language) tells read-only apart. SQLite's text is fixed too.
pub(crate) fn read_only_refusal(error: &DieselError) -> bool {
    match error {
        DieselError::DatabaseError(DatabaseErrorKind::ReadOnlyTransaction, _) => true,
        DieselError::DatabaseError(DatabaseErrorKind::Unknown, info) => {
            let message = info.message();
            // The option's name stays as it is, between spaces, in every translation of
            // the message; a value quoted in another error's text is not between spaces.
            message.contains(" --read-only ") || message.contains(" --super-read-only ")
                // SQLite's SQLITE_READONLY: a file opened read-only, `PRAGMA query_only`.
                || message == "attempt to write a readonly database"
        }
        _ => false,
    }
}

/// Whether `error` says a prepared statement of diesel's or tokio-postgres' is missing
/// from the session or already there: PostgreSQL's `26000` (`prepared statement
/// "__diesel_stmt_3" does not exist`, `... "s12" ...`, or the unnamed statement's text) or
/// `42P05` (`prepared statement "__diesel_stmt_0" already exists`). Only those clients'
/// names count (diesel's `__diesel_stmt_<n>`, tokio-postgres' `s<n>`): a statement a
/// caller prepared by a name of its own (`PREPARE`, `EXECUTE`) keeps its plain error. The
/// library never prepares or deallocates statements by name itself, so on a connection
/// diesel manages this happens only when a pooler switched server sessions under it.
pub(crate) fn statement_lost_by_pooler(error: &DieselError) -> bool {
    let DieselError::DatabaseError(DatabaseErrorKind::Unknown, info) = error else {
        return false;
    };
    let message = info.message();
    let client_named = |name: &str| {
        let number = name
            .strip_prefix("__diesel_stmt_")
            .or_else(|| name.strip_prefix('s'))
            .unwrap_or_default();
        !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit())
    };
    message == "unnamed prepared statement does not exist"
        || message
            .strip_prefix("prepared statement \"")
            .and_then(|rest| {
                rest.strip_suffix("\" does not exist")
                    .or_else(|| rest.strip_suffix("\" already exists"))
            })
            .is_some_and(client_named)
}

/// Whether the connection died.
///
/// diesel reports `ClosedConnection` when libpq has marked the connection dead. When the
/// failure is seen before libpq has (a read that finds the socket closed, a statement on a
/// connection libpq already knows is dead, which is not sent), diesel says `Unknown` or
/// `UnableToSendCommand` with libpq's own texts, English in a Rust process (which never
/// selects a locale for libpq's messages). MySQL's client errors 2006 / 2013 reach diesel
/// as `Unknown` with the client library's own fixed texts (never translated). Texts are
/// compared as prefixes. The one server text is PostgreSQL's for a session ended by
/// `pg_terminate_backend` or a fast shutdown (57P01), in English as for deadlocks
/// ([`retry_reason_of`]). A `COMMIT` that failed that way is followed by a rollback that
/// fails too, which diesel reports as `RollbackErrorOnCommit`: judged by the commit's
/// error.
pub(crate) fn connection_lost(error: &DieselError) -> bool {
    match error {
        DieselError::DatabaseError(DatabaseErrorKind::ClosedConnection, _) => true,
        DieselError::RollbackErrorOnCommit { commit_error, .. } => connection_lost(commit_error),
        DieselError::DatabaseError(
            DatabaseErrorKind::Unknown | DatabaseErrorKind::UnableToSendCommand,
            info,
        ) => LOST_CONNECTION_TEXTS
            .iter()
            .any(|prefix| info.message().starts_with(prefix)),
        _ => false,
    }
}

/// `error` as the lost connection it is when a reply came without the result set a query
/// of the library's owes. diesel-async on MySQL reports such a reply (an OK packet where
/// rows were due: a connection left out of step, or a session cut off mid-reply) as a
/// [`DeserializationError`](DieselError::DeserializationError) of
/// [`UnexpectedEndOfRow`](diesel::result::UnexpectedEndOfRow). The library's reads name
/// every column they select, so no stored value causes it: it is not
/// [`Error::InvalidData`], and neither the reply nor the connection can be trusted (the
/// async classifier marks the connection broken). Applied to the library's own
/// statements only: a caller's query with too few columns gets the same error from
/// diesel, and keeps it.
pub(crate) fn answer_cut_short(error: DieselError) -> DieselError {
    match error {
        DieselError::DeserializationError(cause) if is_cut_short(&*cause) => {
            DieselError::DatabaseError(
                DatabaseErrorKind::ClosedConnection,
                Box::new(format!("{ANSWER_CUT_SHORT} ({cause})")),
            )
        }
        other => other,
    }
}

/// Whether a deserialization error's `cause` is a reply without its result set, see
/// [`answer_cut_short`].
pub(crate) fn is_cut_short(cause: &(dyn std::error::Error + Send + Sync + 'static)) -> bool {
    cause.is::<diesel::result::UnexpectedEndOfRow>()
}

/// The text of [`answer_cut_short`]'s error.
const ANSWER_CUT_SHORT: &str = "a reply came without the rows the query owes: the connection \
     is out of step with the server or was cut off, and is discarded";

/// How the client libraries (and PostgreSQL for a terminated session) word a connection
/// that died; see [`connection_lost`].
const LOST_CONNECTION_TEXTS: [&str; 14] = [
    // libmysqlclient / libmariadb: CR_SERVER_LOST (2013), CR_SERVER_GONE_ERROR (2006).
    "Lost connection to",
    "MySQL server has gone away",
    "Server has gone away",
    // libpq.
    "server closed the connection unexpectedly",
    "SSL connection has been closed unexpectedly",
    "SSL SYSCALL error: EOF detected",
    "could not receive data from server",
    "could not send data to server",
    "no connection to the server",
    // PostgreSQL 57P01.
    "terminating connection due to administrator command",
    // tokio-postgres (diesel-async): the socket closed, or failed.
    "connection closed",
    "error communicating with the server",
    // mysql_async (diesel-async): the socket failed, or MariaDB killed the session (1927).
    "Input/output error",
    "Connection was killed",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct Row(i32);

    fn conflict() -> Conflict {
        Conflict::new(
            "orders",
            "7".into(),
            Token::Version(3),
            Token::Version(5),
            Row(1),
        )
    }

    #[test]
    fn a_statement_the_session_never_prepared_names_the_pooler() {
        let unknown = |message: &str| {
            Error::from(DieselError::DatabaseError(
                DatabaseErrorKind::Unknown,
                Box::new(message.to_string()),
            ))
        };
        for message in [
            "prepared statement \"__diesel_stmt_3\" does not exist",
            "prepared statement \"s12\" does not exist",
            "unnamed prepared statement does not exist",
            "prepared statement \"__diesel_stmt_0\" already exists",
        ] {
            let error = unknown(message);
            assert_eq!(error.kind(), "statement_lost_by_pooler", "{message}");
            assert!(!error.is_retryable());
            assert!(error.to_string().contains("max_prepared_statements"));
        }
        // A quoted name with a quote in it is not one identifier: a user's text.
        for message in [
            "prepared statement \"a\" does not exist\" does not exist",
            "relation \"s12\" does not exist",
            // A caller's own PREPARE / EXECUTE names.
            "prepared statement \"my_report\" does not exist",
            "prepared statement \"s\" does not exist",
            "prepared statement \"s1x\" already exists",
        ] {
            assert_eq!(unknown(message).kind(), "database", "{message}");
        }
    }

    #[test]
    fn conflict_gives_back_the_current_row_by_type() {
        let c = Box::new(conflict());
        assert_eq!(c.current::<Row>(), Some(&Row(1)));
        assert_eq!(c.current::<String>(), None);
        let c = c.into_current::<String>().unwrap_err();
        assert_eq!(c.into_current::<Row>().unwrap(), Row(1));
    }

    #[test]
    fn conflict_message_says_what_happened_and_what_to_do() {
        let msg = Error::Conflict(Box::new(conflict())).to_string();
        assert_eq!(
            msg,
            "`orders` row 7 was changed by someone else (expected version 3, found version 5); \
             nothing was written: re-apply your change to the current row and save again"
        );
    }

    #[test]
    fn closed_connection_is_ambiguous_only_outside_a_transaction() {
        let closed = || {
            DieselError::DatabaseError(
                DatabaseErrorKind::ClosedConnection,
                Box::new("server closed the connection".to_string()),
            )
        };
        assert!(matches!(
            Error::from_write(closed(), false),
            Error::Ambiguous { .. }
        ));
        assert!(matches!(
            Error::from_write(closed(), true),
            Error::Database(_)
        ));
        assert!(!Error::from_write(closed(), false).is_retryable());
    }

    #[test]
    fn an_answer_cut_short_is_a_lost_connection_where_the_library_classifies_it() {
        let cut =
            || DieselError::DeserializationError(Box::new(diesel::result::UnexpectedEndOfRow));
        let classified =
            |inside| crate::flow::compare_and_set::classify_given(cut(), inside, |_| None);
        assert!(matches!(
            classified(false),
            Error::Ambiguous { source } if connection_lost(&source)
        ));
        assert!(matches!(
            classified(true),
            Error::Database(source) if connection_lost(&source)
        ));
        // A caller's own query with too few columns keeps diesel's error.
        assert!(matches!(
            Error::from(cut()),
            Error::Database(DieselError::DeserializationError(_))
        ));
        // A value that does not read is the stored data's fault, and stays so.
        let bad = DieselError::DeserializationError("invalid digit found in string".into());
        assert!(matches!(
            answer_cut_short(bad),
            DieselError::DeserializationError(_)
        ));
    }

    #[test]
    fn a_commit_lost_with_its_rollback_is_a_lost_connection() {
        let lost = |message: &str| {
            DieselError::DatabaseError(DatabaseErrorKind::Unknown, Box::new(message.to_string()))
        };
        let commit_lost = DieselError::RollbackErrorOnCommit {
            rollback_error: Box::new(lost("MySQL server has gone away")),
            commit_error: Box::new(lost("Lost connection to server during query")),
        };
        assert!(connection_lost(&commit_lost));
        let commit_refused = DieselError::RollbackErrorOnCommit {
            rollback_error: Box::new(lost("MySQL server has gone away")),
            commit_error: Box::new(lost("Deadlock found when trying to get lock")),
        };
        assert!(!connection_lost(&commit_refused));
    }

    #[test]
    fn a_statement_libpq_could_not_send_on_a_dead_connection_is_a_lost_connection() {
        let unsent = |message: &str| {
            DieselError::DatabaseError(
                DatabaseErrorKind::UnableToSendCommand,
                Box::new(message.to_string()),
            )
        };
        assert!(connection_lost(&unsent("no connection to the server\n")));
        assert!(!connection_lost(&unsent(
            "another command is already in progress\n"
        )));
    }

    #[test]
    fn libpq_reports_of_a_dead_socket_are_lost_connections() {
        let unknown = |message: &str| {
            DieselError::DatabaseError(DatabaseErrorKind::Unknown, Box::new(message.to_string()))
        };
        for seen in [
            "SSL connection has been closed unexpectedly\n",
            "server closed the connection unexpectedly\n\tThis probably means the server terminated abnormally\n",
            "terminating connection due to administrator command\n",
            "could not receive data from server: Connection reset by peer\n",
        ] {
            assert!(connection_lost(&unknown(seen)), "{seen}");
        }
        assert!(!connection_lost(&unknown(
            "duplicate key value violates unique constraint \"orders_pkey\""
        )));
    }
}
