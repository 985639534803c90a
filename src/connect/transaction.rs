//! Write transactions that behave the same on every backend.
//!
//! SQLite allows one writer at a time. A plain (deferred) transaction that reads first
//! and writes later must upgrade its lock, and when another connection writes meanwhile
//! SQLite fails it with "database is locked" at once, without waiting for the busy
//! timeout. Starting with `BEGIN IMMEDIATE` takes the write lock up front, so concurrent
//! writers queue behind the busy timeout instead; and the writers of this process take
//! turns in arrival order before that ([`write_gate`](crate::connect::write_gate)), since SQLite's
//! busy handler would let a few of them win nearly every time. PostgreSQL and MySQL need nothing
//! special to begin: their write transactions are ordinary ones.
//!
//! How a transaction ends matters on MySQL: a cluster (MariaDB Galera, MySQL Group
//! Replication) aborts a transaction that lost certification at its `COMMIT`, or at the
//! statement after the abort, `ROLLBACK` included. The library's SQLite and MySQL write
//! transactions are therefore ended here rather than by diesel's `transaction`, see
//! `begin_with`: a failed `COMMIT` is classified by its error number before anything else
//! is sent, and a `ROLLBACK` that fails leaves a connection whose transaction state is
//! known again, or one the pool throws away.

use diesel::connection::{
    AnsiTransactionManager, Connection, LoadConnection, TransactionManager,
    TransactionManagerStatus,
};
use diesel::r2d2::{ManageConnection, PooledConnection, R2D2Connection};
use diesel::result::{DatabaseErrorKind, Error as DieselError};
use std::time::Duration;

use crate::connect::backend::OccBackend;
use crate::error::RetryReason;

use crate::connect::write_gate::MAX_WAIT;

use crate::error::{connection_lost, retry_reason_of, Error};
use crate::retry::Stop;

/// A connection that can run a transaction meant to write.
pub trait WriteTransaction: Connection {
    /// The statement that begins a write transaction where the backend needs a special
    /// one (SQLite: `BEGIN IMMEDIATE`); `None` for an ordinary `BEGIN`.
    const BEGIN_WRITE: Option<&'static str> = None;

    /// Whether the library begins and ends this connection's write transactions itself
    /// (`begin_with`) instead of through diesel's `transaction`.
    #[doc(hidden)]
    const OWN_TRANSACTIONS: bool = false;

    /// Runs `f` in a transaction that takes the write lock up front where the backend
    /// needs it (SQLite: `BEGIN IMMEDIATE`). Commits on `Ok`, rolls back on `Err`. Inside
    /// an open transaction it nests as a savepoint, like [`Connection::transaction`].
    fn write_transaction<T, E, F>(&mut self, f: F) -> Result<T, E>
    where
        F: FnOnce(&mut Self) -> Result<T, E>,
        E: From<DieselError>,
    {
        self.transaction(f)
    }

    /// [`write_transaction`](Self::write_transaction), waiting at most `turn` for this
    /// process's other SQLite writers to take their turns first
    /// ([`write_gate`](crate::connect::write_gate)); lock statements wait no longer than
    /// their bound.
    #[doc(hidden)]
    fn write_transaction_within<T, E, F>(&mut self, turn: Duration, f: F) -> Result<T, E>
    where
        F: FnOnce(&mut Self) -> Result<T, E>,
        E: From<DieselError>,
    {
        let _ = turn;
        self.write_transaction(f)
    }
}

#[cfg(feature = "postgres")]
impl WriteTransaction for diesel::PgConnection {}

#[cfg(feature = "mysql")]
impl WriteTransaction for diesel::MysqlConnection {
    const OWN_TRANSACTIONS: bool = true;

    fn write_transaction<T, E, F>(&mut self, f: F) -> Result<T, E>
    where
        F: FnOnce(&mut Self) -> Result<T, E>,
        E: From<DieselError>,
    {
        begin_with(self, |conn| conn, "BEGIN", MAX_WAIT, f)
    }
}

#[cfg(feature = "sqlite")]
impl WriteTransaction for diesel::SqliteConnection {
    const BEGIN_WRITE: Option<&'static str> = Some("BEGIN IMMEDIATE");
    const OWN_TRANSACTIONS: bool = true;

    fn write_transaction<T, E, F>(&mut self, f: F) -> Result<T, E>
    where
        F: FnOnce(&mut Self) -> Result<T, E>,
        E: From<DieselError>,
    {
        self.write_transaction_within(MAX_WAIT, f)
    }

    fn write_transaction_within<T, E, F>(&mut self, turn: Duration, f: F) -> Result<T, E>
    where
        F: FnOnce(&mut Self) -> Result<T, E>,
        E: From<DieselError>,
    {
        begin_with(self, |conn| conn, "BEGIN IMMEDIATE", turn, f)
    }
}

impl<M> WriteTransaction for PooledConnection<M>
where
    M: ManageConnection,
    M::Connection: WriteTransaction<TransactionManager = AnsiTransactionManager>
        + R2D2Connection
        + LoadConnection
        + Send
        + 'static,
    <M::Connection as Connection>::Backend: OccBackend,
{
    fn write_transaction<T, E, F>(&mut self, f: F) -> Result<T, E>
    where
        F: FnOnce(&mut Self) -> Result<T, E>,
        E: From<DieselError>,
    {
        self.write_transaction_within(MAX_WAIT, f)
    }

    fn write_transaction_within<T, E, F>(&mut self, turn: Duration, f: F) -> Result<T, E>
    where
        F: FnOnce(&mut Self) -> Result<T, E>,
        E: From<DieselError>,
    {
        if !M::Connection::OWN_TRANSACTIONS {
            return self.transaction(f);
        }
        // The pool's transaction manager keeps its state in the inner connection, so
        // the transaction is begun and ended there while `f` gets the pooled one.
        let begin = M::Connection::BEGIN_WRITE.unwrap_or("BEGIN");
        begin_with(self, |pooled| &mut **pooled, begin, turn, f)
    }
}

/// Runs `f` on a write transaction that the library opens for one operation (a
/// transition with its hook, a claim, work on a locked row, ...) and commits it.
///
/// When `f` succeeded and the `COMMIT` then failed with the connection, the client cannot
/// know whether the server committed: that is [`Error::Ambiguous`], which no retry policy
/// retries, and never a plain database error that reads as "nothing was written". Every
/// other failure passes unchanged: a connection lost before the `COMMIT` was sent rolls
/// the transaction back on the server. Nested in a transaction of the caller's, nothing
/// commits here, so nothing is ambiguous here either.
pub(crate) fn commit_operation<C, T, E, F>(conn: &mut C, f: F) -> Result<T, E>
where
    C: WriteTransaction,
    F: FnOnce(&mut C) -> Result<T, E>,
    E: From<DieselError> + LostCommit,
{
    commit_operation_within(conn, MAX_WAIT, f)
}

/// [`commit_operation`], waiting at most `turn` for the other SQLite writers of this
/// process ([`WriteTransaction::write_transaction_within`]).
pub(crate) fn commit_operation_within<C, T, E, F>(
    conn: &mut C,
    turn: Duration,
    f: F,
) -> Result<T, E>
where
    C: WriteTransaction,
    F: FnOnce(&mut C) -> Result<T, E>,
    E: From<DieselError> + LostCommit,
{
    let nested = in_transaction(conn);
    let mut committing = false;
    let result: Result<T, Ended<E>> = conn.write_transaction_within(turn, |conn| {
        let value = f(conn).map_err(Ended::Operation)?;
        committing = true;
        Ok(value)
    });
    let error = match result {
        Ok(value) => return Ok(value),
        Err(Ended::Transaction(source)) if committing => {
            return Err(E::from_occ(failed_commit(source, nested)))
        }
        // `BEGIN` failed, or the rollback after the operation's own failure.
        Err(Ended::Transaction(source)) => E::from(source),
        Err(Ended::Operation(error)) => error,
    };
    if nested {
        Err(error)
    } else {
        // Failed before the COMMIT was sent: the server rolls back whatever the
        // transaction wrote, even if the connection died with it (a statement's executor
        // cannot tell it is inside a transaction once diesel has given the connection up,
        // so it may have said `Ambiguous`).
        Err(error.rolled_back())
    }
}

/// How a library transaction ended badly: the operation's own error, or the
/// transaction's (`BEGIN`, `COMMIT`), kept raw for [`failed_commit`].
enum Ended<E> {
    Operation(E),
    Transaction(DieselError),
}

impl<E> From<DieselError> for Ended<E> {
    fn from(error: DieselError) -> Self {
        Ended::Transaction(error)
    }
}

/// What a failed `COMMIT` of a transaction the library opened means; the one judgement of
/// the blocking and the async paths. `nested`: the release of a savepoint inside the
/// caller's transaction, which commits nothing (its error is classified as any
/// statement's; the caller's own `COMMIT` decides).
///
/// - a lost connection: [`Error::Ambiguous`], the server may have committed;
/// - a conflict the server reported there (a serialization failure, a Galera
///   certification abort reported as a deadlock), a Galera node that left the cluster's
///   primary component (it can certify nothing, so it committed nothing) or SQLite's
///   busy database: the transaction was rolled back, [`Error::Retryable`];
/// - anything else is the database's error: a timeout at `COMMIT` (a wait for a
///   semi-synchronous replica, say) may have landed, so it is not retried.
pub(crate) fn failed_commit(source: DieselError, nested: bool) -> Error {
    if nested {
        return Error::from(source);
    }
    if connection_lost(&source) {
        return Error::Ambiguous { source };
    }
    match retry_reason_of(&source) {
        Some(
            reason @ (RetryReason::SerializationFailure
            | RetryReason::Deadlock
            | RetryReason::NodeNotReady
            | RetryReason::Busy),
        ) => Error::Retryable { reason, source },
        _ => Error::classified(source, |_| None),
    }
}

/// An error of an operation's transaction, which [`commit_operation`] judges by whether
/// the `COMMIT` was sent.
pub(crate) trait LostCommit: Sized {
    /// `self`, with an [`Error::Ambiguous`] turned into the plain database error it is.
    fn rolled_back(self) -> Self {
        self.map_occ(|error| match error {
            Error::Ambiguous { source } => Error::Database(source),
            other => other,
        })
    }

    /// `error` as this kind of error.
    fn from_occ(error: Error) -> Self;

    /// `self` with its diesel-occ error, if any, mapped by `f`.
    fn map_occ(self, f: impl FnOnce(Error) -> Error) -> Self;
}

impl LostCommit for Error {
    fn from_occ(error: Error) -> Self {
        error
    }

    fn map_occ(self, f: impl FnOnce(Error) -> Error) -> Self {
        f(self)
    }
}

impl<E> LostCommit for Stop<E> {
    fn from_occ(error: Error) -> Self {
        Stop::Occ(error)
    }

    fn map_occ(self, f: impl FnOnce(Error) -> Error) -> Self {
        match self {
            Stop::Occ(error) => Stop::Occ(f(error)),
            caller => caller,
        }
    }
}

/// `begin` on the connection inside `conn` (or a savepoint when a transaction is already
/// open), `f`, then commit or roll back. On a backend with one writer at a time (SQLite)
/// it first waits its turn among this process's writers.
fn begin_with<C, Inner, T, E, F>(
    conn: &mut C,
    inner: impl Fn(&mut C) -> &mut Inner,
    begin: &str,
    turn: Duration,
    f: F,
) -> Result<T, E>
where
    C: Connection,
    Inner: LoadConnection<TransactionManager = AnsiTransactionManager>,
    Inner::Backend: OccBackend,
    F: FnOnce(&mut C) -> Result<T, E>,
    E: From<DieselError>,
{
    let open = AnsiTransactionManager::transaction_manager_status_mut(inner(conn))
        .transaction_depth()?
        .is_some();
    if open {
        return conn.transaction(f);
    }
    // Held until the transaction has ended (see `write_gate`); `None` after a long wait:
    // then SQLite's own busy timeout decides.
    let _turn = Inner::Backend::ONE_WRITER.then(|| crate::connect::write_gate::wait_for_turn(turn));
    AnsiTransactionManager::begin_transaction_sql(inner(conn), begin)?;
    match f(conn) {
        Ok(value) => commit_top_level(inner(conn))
            .map(|()| value)
            .map_err(E::from),
        Err(e) => {
            roll_back_top_level(inner(conn));
            Err(e)
        }
    }
}

/// Commits the top-level transaction on `conn`. diesel's own commit answers a failed
/// `COMMIT` with a `ROLLBACK` at once, which on MySQL wipes the error number that says
/// whether the server rolled the transaction back: a certification failure in a cluster
/// is error 1213 at `COMMIT`, which diesel reports as `Unknown` with a text in the
/// server's language. So the `COMMIT` is sent here, its number is read first, and a
/// number that means "rolled back, run it again" comes back with the kind diesel gives
/// 1213 on any other statement.
fn commit_top_level<C>(conn: &mut C) -> Result<(), DieselError>
where
    C: LoadConnection<TransactionManager = AnsiTransactionManager>,
    C::Backend: OccBackend,
{
    match conn.batch_execute("COMMIT") {
        Ok(()) => {
            // The transaction this function's caller began at the top level has ended.
            *AnsiTransactionManager::transaction_manager_status_mut(conn) =
                TransactionManagerStatus::default();
            Ok(())
        }
        Err(error) => {
            let reason = C::Backend::retry_reason(conn, &error);
            // A failed COMMIT can leave the transaction open; end it, report the cause.
            roll_back_top_level(conn);
            Err(commit_error_given(error, reason))
        }
    }
}

/// The error of a failed `COMMIT`, given why the server says it can be retried: one that
/// the server rolled back (a deadlock, a serialization or certification failure) comes
/// back with the kind diesel gives MySQL's 1213 on any other statement, where the client
/// reported it as `Unknown`. What the blocking and the async commits share.
pub(crate) fn commit_error_given(error: DieselError, reason: Option<RetryReason>) -> DieselError {
    let rolled_back = matches!(
        reason,
        Some(RetryReason::Deadlock | RetryReason::SerializationFailure)
    );
    match error {
        DieselError::DatabaseError(DatabaseErrorKind::Unknown, info) if rolled_back => {
            DieselError::DatabaseError(DatabaseErrorKind::SerializationFailure, info)
        }
        other => other,
    }
}

/// Rolls the top-level transaction on `conn` back. When the `ROLLBACK` fails (a cluster
/// reports an abort at the next statement, `ROLLBACK` included), diesel marks the
/// connection broken for good; one more `ROLLBACK` that succeeds proves the server holds
/// no transaction for it, and the connection is usable again. A connection that cannot
/// answer even that stays marked broken, so the pool closes it instead of handing it out.
fn roll_back_top_level<C>(conn: &mut C)
where
    C: Connection<TransactionManager = AnsiTransactionManager>,
{
    if AnsiTransactionManager::rollback_transaction(conn).is_ok() {
        return;
    }
    let status = if conn.batch_execute("ROLLBACK").is_ok() {
        TransactionManagerStatus::default()
    } else {
        TransactionManagerStatus::InError
    };
    *AnsiTransactionManager::transaction_manager_status_mut(conn) = status;
}

/// [`Connection::transaction`] (a savepoint inside an open transaction), answering with
/// the error that made it roll back even when the rollback fails too: diesel would answer
/// with the rollback's error instead, and when a cluster has aborted the whole transaction
/// (a Galera node, for a conflicting write from another node), that is "SAVEPOINT ...
/// does not exist", which hides the conflict a retry would get past. The transaction
/// itself is then rolled back by whoever opened it.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) fn nested<C, T>(
    conn: &mut C,
    f: impl FnOnce(&mut C) -> Result<T, DieselError>,
) -> Result<T, DieselError>
where
    C: Connection,
{
    let mut cause = None;
    let result = conn.transaction(|conn| {
        f(conn).map_err(|error| {
            cause = Some(error);
            DieselError::RollbackTransaction
        })
    });
    result.map_err(|error| cause.take().unwrap_or(error))
}

/// Whether `conn` has an open transaction (so a dropped connection rolls the write back).
pub(crate) fn in_transaction<C: Connection>(conn: &mut C) -> bool {
    C::TransactionManager::transaction_manager_status_mut(conn)
        .transaction_depth()
        .map(|depth| depth.is_some())
        // A broken transaction manager means the connection is in an unknown state:
        // treat the write as possibly applied.
        .unwrap_or(false)
}
