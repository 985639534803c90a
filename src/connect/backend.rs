//! What diesel-occ needs to know about each database backend.
//!
//! Three things differ per backend and nothing else does: how to read the latest
//! committed row inside a transaction (the lock clause), how to tell a transient refusal
//! from any other database error, and how to render a SQL fragment for messages and
//! checks. Everything else is written once, generically.

use diesel::backend::Backend;
use diesel::connection::LoadConnection;
use diesel::query_builder::{QueryBuilder, QueryFragment};
#[cfg(feature = "mysql")]
use diesel::result::DatabaseErrorKind;
use diesel::result::Error as DieselError;
use diesel::QueryResult;

use crate::error::{retry_reason_of, RetryReason};

/// A backend diesel-occ supports: SQLite, PostgreSQL and MySQL / MariaDB.
pub trait OccBackend: Backend + Default {
    /// The backend's name in OpenTelemetry's database conventions (`db.system`), for the
    /// library's telemetry.
    const DB_SYSTEM: &'static str;

    /// Appended to the `SELECT` that explains a miss inside a transaction, so that it reads
    /// the latest committed row (not the transaction's snapshot) and keeps it locked for the
    /// write that usually follows (the read that explains a miss).
    const LOCKING_READ: &'static str;

    /// The NULL-safe equality operator, with spaces: `a <op> b` is true when both are NULL.
    const NULL_SAFE_EQ: &'static str;

    /// Appended to a `SELECT` that locks its rows until the transaction ends (pessimistic
    /// writes): `FOR UPDATE`; nothing on SQLite, whose write transaction is exclusive.
    const FOR_UPDATE: &'static str = " FOR UPDATE";

    /// Appended to a `SELECT` that takes rows for this transaction, passing over rows other
    /// transactions hold (task claiming): `FOR UPDATE SKIP LOCKED` on PostgreSQL and MySQL
    /// 8 / MariaDB 10.6+; nothing on SQLite, whose write transactions take turns.
    const SKIP_LOCKED: &'static str = " FOR UPDATE SKIP LOCKED";

    /// How an `INSERT` says "unless a row with this key exists".
    const DUPLICATES: Duplicates = Duplicates::OnConflict;

    /// Whether the guarded updates of many rows can be sent as one statement
    /// (PostgreSQL's `UPDATE ... FROM (VALUES ...)`), so that a batch costs a constant
    /// number of round trips.
    const COMBINES_UPDATES: bool = false;

    /// Whether an `UPDATE` can hand back the rows it wrote (`RETURNING`: PostgreSQL, and
    /// SQLite since 3.35), so that a write that must answer with them is one statement.
    const RETURNING: bool = false;

    /// Whether a failed statement aborts its whole transaction (PostgreSQL), rather than
    /// being undone alone (MySQL, SQLite).
    const FAILURE_ABORTS_TRANSACTION: bool = false;

    /// Whether one connection writes at a time (SQLite): then a write statement sent
    /// outside a transaction also takes its turn in this process's queue of writers
    /// (see the module `connect::write_gate`), as write transactions do.
    const ONE_WRITER: bool = false;

    /// Whether a new connection may reach a writable server where this one met a
    /// read-only one: a standby still being promoted behind a proxy, a server set
    /// read-only while a failover moves its clients, a multi-host URL that skips standbys.
    /// Not SQLite, whose every connection opens the same file.
    const RECONNECT_MAY_REACH_PRIMARY: bool = true;

    /// Whether the backend's diesel-async connection ends, by itself, a transaction whose
    /// top-level `COMMIT` failed: SQLite's (`SyncConnectionWrapper`) runs diesel's blocking
    /// transaction manager, which rolls back then (or marks itself broken when it cannot),
    /// where diesel-async's own manager leaves the transaction to its caller.
    #[doc(hidden)]
    const ASYNC_ENDS_FAILED_COMMIT: bool = false;

    /// Whether a `LIMIT` is written into the SQL as a number rather than bound, each limit
    /// then its own cached statement. SQLite (3.46 and later) recompiles a prepared
    /// statement whenever the value bound to its `LIMIT` changes, and diesel binds every
    /// parameter again on every run, so a bound limit cost a full parse and plan per
    /// claim even from the statement cache. PostgreSQL plans a prepared statement for any
    /// value after a few runs (its generic plan), not knowing how few rows the `LIMIT`
    /// keeps: claims of one row went from 1.07x to 1.36x the hand-written queue statement
    /// with the limit written in (W6). Limits above 1,000 are bound all the same, so that
    /// a worker that varies its limit cannot fill its connection's statement cache.
    const LIMIT_IN_SQL: bool = false;

    /// Why `error`, just returned by a statement on `conn`, can be fixed by running the
    /// transaction again; `None` for every other error.
    ///
    /// The default looks at diesel's error kind and at the server's own fixed message
    /// texts only. MySQL overrides it to ask the server for the error
    /// number, which does not depend on the message language.
    fn retry_reason<C>(conn: &mut C, error: &DieselError) -> Option<RetryReason>
    where
        C: LoadConnection<Backend = Self>,
    {
        let _ = conn;
        retry_reason_of(error)
    }

    /// [`retry_reason`](Self::retry_reason) on a diesel-async connection: the same
    /// judgement, the server asked over the async connection where MySQL needs its number.
    #[cfg(feature = "async")]
    #[doc(hidden)]
    fn retry_reason_async<C>(
        conn: &mut C,
        error: &DieselError,
    ) -> impl std::future::Future<Output = Option<RetryReason>> + Send
    where
        C: diesel_async::AsyncConnection<Backend = Self>,
    {
        let _ = conn;
        std::future::ready(retry_reason_of(error))
    }

    /// Whether `conn`'s server may apply other servers' commits after its own statements
    /// ran (a MariaDB Galera node): there a write that matched nothing while its re-read
    /// shows the expected token was applied against the node's older copy of the row,
    /// and a fresh attempt can succeed. Asked only after such a miss.
    fn applies_writes_late<C>(conn: &mut C) -> bool
    where
        C: LoadConnection<Backend = Self>,
    {
        let _ = conn;
        false
    }

    /// The SQL text of `fragment` as this backend writes it, without bind values.
    fn render<F: QueryFragment<Self> + ?Sized>(fragment: &F) -> QueryResult<String>;

    /// How many fractional digits of a second the column `column` of `table` (in
    /// `schema`, or the connection's current one) stores, as the schema declares it;
    /// `None` when it does not say (SQLite keeps the text written, so every digit).
    fn stored_second_digits<C>(
        conn: &mut C,
        schema: Option<&str>,
        table: &str,
        column: &str,
    ) -> QueryResult<Option<u32>>
    where
        C: LoadConnection<Backend = Self>,
    {
        let _ = (conn, schema, table, column);
        Ok(None)
    }
}

/// A time column's declared fractional digits, read from `information_schema.columns`.
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[derive(diesel::QueryableByName)]
pub(crate) struct DeclaredDigits {
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Integer>)]
    digits: Option<i32>,
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl DeclaredDigits {
    /// The digits a found row declares: `None` when the column is not found or declares
    /// none.
    pub(crate) fn of(found: Option<DeclaredDigits>) -> Option<u32> {
        found
            .and_then(|row| row.digits)
            .and_then(|digits| u32::try_from(digits).ok())
    }
}

/// `sql`, a read of `information_schema.columns` binding the schema (NULL for the
/// connection's own), the table and the column; sync and async connections load it.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn declared_digits_query<DB>(
    sql: &str,
    schema: Option<&str>,
    table: &str,
    column: &str,
) -> diesel::query_builder::BoxedSqlQuery<'static, DB, diesel::query_builder::SqlQuery>
where
    DB: Backend
        + diesel::sql_types::HasSqlType<diesel::sql_types::Text>
        + diesel::sql_types::HasSqlType<diesel::sql_types::Nullable<diesel::sql_types::Text>>,
    Option<String>:
        diesel::serialize::ToSql<diesel::sql_types::Nullable<diesel::sql_types::Text>, DB>,
    String: diesel::serialize::ToSql<diesel::sql_types::Text, DB>,
{
    use diesel::sql_types::{Nullable, Text};
    diesel::sql_query(sql)
        .into_boxed::<DB>()
        .bind::<Nullable<Text>, _>(schema.map(str::to_string))
        .bind::<Text, _>(table.to_string())
        .bind::<Text, _>(column.to_string())
}

/// Reads a time column's declared digits with `sql` ([`declared_digits_query`]).
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn declared_digits<C: LoadConnection>(
    conn: &mut C,
    sql: &str,
    schema: Option<&str>,
    table: &str,
    column: &str,
) -> QueryResult<Option<u32>>
where
    C::Backend: diesel::sql_types::HasSqlType<diesel::sql_types::Text>
        + diesel::sql_types::HasSqlType<diesel::sql_types::Nullable<diesel::sql_types::Text>>,
    Option<String>:
        diesel::serialize::ToSql<diesel::sql_types::Nullable<diesel::sql_types::Text>, C::Backend>,
    String: diesel::serialize::ToSql<diesel::sql_types::Text, C::Backend>,
    diesel::query_builder::BoxedSqlQuery<'static, C::Backend, diesel::query_builder::SqlQuery>:
        diesel::query_dsl::LoadQuery<'static, C, DeclaredDigits>,
{
    use diesel::{OptionalExtension, RunQueryDsl};
    let found = declared_digits_query::<C::Backend>(sql, schema, table, column)
        .get_result::<DeclaredDigits>(conn)
        .optional()?;
    Ok(DeclaredDigits::of(found))
}

/// PostgreSQL's read of a time column's declared digits.
#[cfg(feature = "postgres")]
pub(crate) const PG_DECLARED_DIGITS: &str =
    "SELECT datetime_precision::integer AS digits FROM information_schema.columns \
     WHERE table_schema = COALESCE($1, current_schema()) AND table_name = $2 \
     AND column_name = $3";

/// Whether a MySQL-protocol server is a Galera node, which applies other nodes' commits
/// after its own statements ran (MySQL has no such variable: an error, read as no).
#[cfg(feature = "mysql")]
pub(crate) const APPLIES_WRITES_LATE: &str = "@@wsrep_on";

/// MySQL's read of a time column's declared digits.
#[cfg(feature = "mysql")]
pub(crate) const MYSQL_DECLARED_DIGITS: &str =
    "SELECT CAST(datetime_precision AS SIGNED) AS digits \
     FROM information_schema.columns WHERE table_schema = COALESCE(?, DATABASE()) \
     AND table_name = ? AND column_name = ?";

/// How a backend's `INSERT` leaves an existing row alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Duplicates {
    /// `ON CONFLICT DO NOTHING` (PostgreSQL, SQLite).
    OnConflict,
    /// `ON DUPLICATE KEY UPDATE <column> = <column>` (MySQL / MariaDB; it reports the row
    /// as found, so the affected-row count cannot tell who inserted it).
    OnDuplicateKey,
}

/// Renders with a backend whose query builder is `Default` (all three are).
fn render_with<DB, F>(fragment: &F) -> QueryResult<String>
where
    DB: Backend + Default,
    DB::QueryBuilder: Default,
    F: QueryFragment<DB> + ?Sized,
{
    let mut builder = DB::QueryBuilder::default();
    // `to_sql` is doc-hidden in diesel ("for connections"), but it is the one way to get
    // a fragment's SQL without formatting its bind values, which may be large documents.
    fragment.to_sql(&mut builder, &DB::default())?;
    Ok(builder.finish())
}

#[cfg(feature = "sqlite")]
impl OccBackend for diesel::sqlite::Sqlite {
    const DB_SYSTEM: &'static str = "sqlite";
    // SQLite has no row locks: a transaction whose snapshot is stale cannot write at all
    // (busy), so a plain read inside it is already the latest one it can act on.
    const LOCKING_READ: &'static str = "";
    const NULL_SAFE_EQ: &'static str = " IS ";
    const SKIP_LOCKED: &'static str = "";
    const FOR_UPDATE: &'static str = "";
    const ONE_WRITER: bool = true;
    const RECONNECT_MAY_REACH_PRIMARY: bool = false;
    const ASYNC_ENDS_FAILED_COMMIT: bool = true;
    const RETURNING: bool = true;
    const LIMIT_IN_SQL: bool = true;

    fn render<F: QueryFragment<Self> + ?Sized>(fragment: &F) -> QueryResult<String> {
        render_with(fragment)
    }
}

#[cfg(feature = "postgres")]
impl OccBackend for diesel::pg::Pg {
    const DB_SYSTEM: &'static str = "postgresql";
    // The lock a non-key UPDATE takes. At READ COMMITTED it reads the latest row; at
    // REPEATABLE READ and SERIALIZABLE a row changed after the snapshot fails at once with
    // a serialization failure (retryable) instead of showing the snapshot's stale row.
    const LOCKING_READ: &'static str = " FOR NO KEY UPDATE";
    const NULL_SAFE_EQ: &'static str = " IS NOT DISTINCT FROM ";
    const COMBINES_UPDATES: bool = true;
    const FAILURE_ABORTS_TRANSACTION: bool = true;
    const RETURNING: bool = true;
    const LIMIT_IN_SQL: bool = true;

    fn render<F: QueryFragment<Self> + ?Sized>(fragment: &F) -> QueryResult<String> {
        render_with(fragment)
    }

    fn stored_second_digits<C>(
        conn: &mut C,
        schema: Option<&str>,
        table: &str,
        column: &str,
    ) -> QueryResult<Option<u32>>
    where
        C: LoadConnection<Backend = Self>,
    {
        declared_digits(conn, PG_DECLARED_DIGITS, schema, table, column)
    }
}

#[cfg(feature = "mysql")]
impl OccBackend for diesel::mysql::Mysql {
    const DB_SYSTEM: &'static str = "mysql";
    // A current read at every isolation level. `LOCK IN SHARE MODE` deadlocks at READ
    // COMMITTED when the caller then writes the row while another stale writer waits.
    const LOCKING_READ: &'static str = " FOR UPDATE";
    const NULL_SAFE_EQ: &'static str = " <=> ";
    const DUPLICATES: Duplicates = Duplicates::OnDuplicateKey;

    fn retry_reason<C>(conn: &mut C, error: &DieselError) -> Option<RetryReason>
    where
        C: LoadConnection<Backend = Self>,
    {
        let number = mysql_asks_error_number(error)
            .then(|| mysql_error_number(conn, error))
            .flatten();
        mysql_retry_reason_given(error, number)
    }

    #[cfg(feature = "async")]
    async fn retry_reason_async<C>(conn: &mut C, error: &DieselError) -> Option<RetryReason>
    where
        C: diesel_async::AsyncConnection<Backend = Self>,
    {
        use diesel_async::{RunQueryDsl, TransactionManager};
        // A connection a cancelled call left broken is sent nothing more.
        let usable = C::TransactionManager::transaction_manager_status_mut(conn)
            .transaction_depth()
            .is_ok();
        let mut number = None;
        if usable
            && mysql_asks_error_number(error)
            && conn.batch_execute(MYSQL_ASK_ERROR_NUMBER).await.is_ok()
        {
            let noted = diesel::select(diesel::dsl::sql::<ErrorNumber>(MYSQL_READ_ERROR_NUMBER))
                .get_result::<NotedError>(conn)
                .await;
            number = reported_number(error, noted.ok());
        }
        mysql_retry_reason_given(error, number)
    }

    fn applies_writes_late<C>(conn: &mut C) -> bool
    where
        C: LoadConnection<Backend = Self>,
    {
        use diesel::RunQueryDsl;
        // MySQL has no such variable (an error): not a Galera node.
        diesel::select(diesel::dsl::sql::<diesel::sql_types::Bool>(
            APPLIES_WRITES_LATE,
        ))
        .get_result::<bool>(conn)
        .unwrap_or(false)
    }

    fn render<F: QueryFragment<Self> + ?Sized>(fragment: &F) -> QueryResult<String> {
        render_with(fragment)
    }

    fn stored_second_digits<C>(
        conn: &mut C,
        schema: Option<&str>,
        table: &str,
        column: &str,
    ) -> QueryResult<Option<u32>>
    where
        C: LoadConnection<Backend = Self>,
    {
        declared_digits(conn, MYSQL_DECLARED_DIGITS, schema, table, column)
    }
}

/// The MySQL / MariaDB error numbers that a fresh attempt can fix.
#[cfg(feature = "mysql")]
fn mysql_retry_reason(number: u32) -> Option<RetryReason> {
    match number {
        // ER_LOCK_DEADLOCK
        1213 => Some(RetryReason::Deadlock),
        // ER_LOCK_WAIT_TIMEOUT (MariaDB also reports NOWAIT / SKIP LOCKED failures so),
        // ER_LOCK_NOWAIT (MySQL 8)
        1205 | 3572 => Some(RetryReason::LockTimeout),
        // ER_STATEMENT_TIMEOUT: MariaDB's `max_statement_time`, with which the library's
        // lock statements bound their row-lock waits (sub-second; `innodb_lock_wait_timeout`
        // has whole seconds only)
        1969 => Some(RetryReason::LockTimeout),
        // ER_CHECKREAD: MariaDB's snapshot isolation found the row changed since the read
        1020 => Some(RetryReason::SerializationFailure),
        // ER_QUERY_INTERRUPTED: a `KILL QUERY` (and a Galera node's own record of a
        // statement it aborted, before the 1213 it answers with). Either way the
        // statement did nothing, and the library rolls its transaction back before running
        // the operation again.
        1317 => Some(RetryReason::SerializationFailure),
        // ER_TRANSACTION_ROLLBACK_DURING_COMMIT: MySQL Group Replication rolled the
        // transaction back at its COMMIT (it lost certification)
        3101 => Some(RetryReason::SerializationFailure),
        _ => None,
    }
}

/// Why `error` can be retried on MySQL, given the number the server gave it (`None` when
/// it was not asked or could not say): the one judgement of both drivers.
#[cfg(feature = "mysql")]
pub(crate) fn mysql_retry_reason_given(
    error: &DieselError,
    number: Option<u32>,
) -> Option<RetryReason> {
    match error {
        // diesel maps exactly 1213 to this kind on MySQL (diesel-async does not).
        DieselError::DatabaseError(DatabaseErrorKind::SerializationFailure, _) => {
            Some(RetryReason::Deadlock)
        }
        // The number decides (a trigger may `SIGNAL` the very text of a lock wait
        // timeout); the text only where the connection cannot say.
        DieselError::DatabaseError(DatabaseErrorKind::Unknown, info) => match number {
            Some(number) => {
                mysql_retry_reason(number).or_else(|| galera_not_ready(number, info.message()))
            }
            None => retry_reason_of(error),
        },
        _ => None,
    }
}

/// A MariaDB Galera node that cannot run the statement now: its answers borrow general
/// numbers (1047 "unknown command", 1180 "error during commit"), so the number and the
/// node's fixed English text decide together. Nothing was written: a node not ready runs
/// no statement, and one that lost the primary component cannot order a commit.
#[cfg(feature = "mysql")]
fn galera_not_ready(number: u32, message: &str) -> Option<RetryReason> {
    const NOT_READY: &str = "WSREP has not yet prepared node for application use";
    const NOT_PRIMARY: &str = "Error while appending streaming replication fragment\
                               (provider status: Not connected to Primary Component)";
    match (number, message) {
        (1047, NOT_READY) | (1180, NOT_PRIMARY) => Some(RetryReason::NodeNotReady),
        _ => None,
    }
}

/// Whether the server is to be asked for the number of `error`: only diesel's `Unknown`
/// kind leaves it open; a connection that died cannot answer, and an error of the client
/// itself has no number on the server.
#[cfg(feature = "mysql")]
pub(crate) fn mysql_asks_error_number(error: &DieselError) -> bool {
    match error {
        DieselError::DatabaseError(DatabaseErrorKind::Unknown, info) => {
            !crate::error::connection_lost(error)
                && !MYSQL_ASYNC_CLIENT_ERRORS
                    .iter()
                    .any(|prefix| info.message().starts_with(prefix))
        }
        _ => false,
    }
}

/// How mysql_async words its own errors (a closed socket, a packet out of order), which
/// diesel-async reports as `Unknown` with this text: no statement of the server failed,
/// and the connection may not answer a question.
#[cfg(feature = "mysql")]
const MYSQL_ASYNC_CLIENT_ERRORS: [&str; 5] = [
    "Driver error: ",
    "Input/output error: ",
    "Other error: ",
    "URL error: ",
    "TLS error: ",
];

/// The statements that ask a MySQL server for the numbers and texts of the conditions the
/// last statement raised (the first three and the last), into session variables
/// ([`MYSQL_READ_ERROR_NUMBER`] reads them). A statement can raise several, and the one
/// the client was answered with is neither always the first nor always the last: a
/// MariaDB Galera node that aborts a statement for another node's write keeps 1317
/// "interrupted" before the 1213 it answers with; MariaDB adds a 4094 note ("At line N in
/// trigger") after an error raised inside a trigger. [`reported_number`] picks the
/// condition by its text. `GET DIAGNOSTICS` does not clear the diagnostics area, so the
/// count is read before the conditions; a condition past the count is read as `NULL`.
/// Sent only after a statement has already failed.
#[cfg(feature = "mysql")]
pub(crate) const MYSQL_ASK_ERROR_NUMBER: &str = "GET DIAGNOSTICS @diesel_occ_conditions = NUMBER; \
     GET DIAGNOSTICS CONDITION 1 @diesel_occ_errno_1 = MYSQL_ERRNO, @diesel_occ_text_1 = MESSAGE_TEXT; \
     GET DIAGNOSTICS CONDITION 2 @diesel_occ_errno_2 = MYSQL_ERRNO, @diesel_occ_text_2 = MESSAGE_TEXT; \
     GET DIAGNOSTICS CONDITION 3 @diesel_occ_errno_3 = MYSQL_ERRNO, @diesel_occ_text_3 = MESSAGE_TEXT; \
     GET DIAGNOSTICS CONDITION @diesel_occ_conditions \
     @diesel_occ_errno_4 = MYSQL_ERRNO, @diesel_occ_text_4 = MESSAGE_TEXT";

/// Reads the numbers and texts [`MYSQL_ASK_ERROR_NUMBER`] noted, `NULL`s for conditions
/// the statement did not raise (the variables may hold an earlier question's answers).
#[cfg(feature = "mysql")]
pub(crate) const MYSQL_READ_ERROR_NUMBER: &str = "\
     IF(@diesel_occ_conditions >= 1, @diesel_occ_errno_1, NULL), \
     IF(@diesel_occ_conditions >= 1, @diesel_occ_text_1, NULL), \
     IF(@diesel_occ_conditions >= 2, @diesel_occ_errno_2, NULL), \
     IF(@diesel_occ_conditions >= 2, @diesel_occ_text_2, NULL), \
     IF(@diesel_occ_conditions >= 3, @diesel_occ_errno_3, NULL), \
     IF(@diesel_occ_conditions >= 3, @diesel_occ_text_3, NULL), \
     IF(@diesel_occ_conditions >= 1, @diesel_occ_errno_4, NULL), \
     IF(@diesel_occ_conditions >= 1, @diesel_occ_text_4, NULL)";

#[cfg(feature = "mysql")]
type ConditionNumber =
    diesel::sql_types::Nullable<diesel::sql_types::Unsigned<diesel::sql_types::Integer>>;
#[cfg(feature = "mysql")]
type ConditionText = diesel::sql_types::Nullable<diesel::sql_types::Text>;

/// The SQL type of [`MYSQL_READ_ERROR_NUMBER`].
#[cfg(feature = "mysql")]
pub(crate) type ErrorNumber = (
    ConditionNumber,
    ConditionText,
    ConditionNumber,
    ConditionText,
    ConditionNumber,
    ConditionText,
    ConditionNumber,
    ConditionText,
);

/// What [`MYSQL_READ_ERROR_NUMBER`] reads: number and text of conditions 1 to 3 and of
/// the last.
#[cfg(feature = "mysql")]
pub(crate) type NotedError = (
    Option<u32>,
    Option<String>,
    Option<u32>,
    Option<String>,
    Option<u32>,
    Option<String>,
    Option<u32>,
    Option<String>,
);

/// The number of `error` among the conditions the server `noted`: the condition whose
/// text is the one the client was answered with; `None` when none is (the error sits in
/// the middle of a long list), and the text alone decides.
#[cfg(feature = "mysql")]
pub(crate) fn reported_number(error: &DieselError, noted: Option<NotedError>) -> Option<u32> {
    let DieselError::DatabaseError(_, info) = error else {
        return None;
    };
    let (e1, t1, e2, t2, e3, t3, e4, t4) = noted?;
    [(e1, t1), (e2, t2), (e3, t3), (e4, t4)]
        .into_iter()
        .find_map(|(number, text)| match (number, text) {
            (Some(number), Some(text)) if text == info.message() => Some(number),
            _ => None,
        })
}

/// Asks the server for the number of the error the last statement raised (two round
/// trips, after a statement has already failed).
#[cfg(feature = "mysql")]
fn mysql_error_number<C>(conn: &mut C, error: &DieselError) -> Option<u32>
where
    C: LoadConnection<Backend = diesel::mysql::Mysql>,
{
    use diesel::RunQueryDsl;
    conn.batch_execute(MYSQL_ASK_ERROR_NUMBER).ok()?;
    let noted = diesel::select(diesel::dsl::sql::<ErrorNumber>(MYSQL_READ_ERROR_NUMBER))
        .get_result::<NotedError>(conn);
    reported_number(error, noted.ok())
}

#[cfg(all(test, feature = "mysql"))]
mod tests {
    use super::*;

    fn unknown(message: &str) -> DieselError {
        DieselError::DatabaseError(DatabaseErrorKind::Unknown, Box::new(message.to_string()))
    }

    /// A noted condition of `number` and `text`, as the fourth (the last) of the statement.
    fn noted(number: u32, text: &str) -> NotedError {
        (
            None,
            None,
            None,
            None,
            None,
            None,
            Some(number),
            Some(text.into()),
        )
    }

    #[test]
    fn the_number_is_the_condition_the_client_was_answered_with() {
        let deadlock =
            unknown("Deadlock found when trying to get lock; try restarting transaction");
        // A Galera abort: 1317 first, the 1213 answered last.
        let abort = (
            Some(1317),
            Some("Query execution was interrupted".into()),
            Some(1213),
            Some("Deadlock found when trying to get lock; try restarting transaction".into()),
            None,
            None,
            Some(1213),
            Some("Deadlock found when trying to get lock; try restarting transaction".into()),
        );
        assert_eq!(reported_number(&deadlock, Some(abort)), Some(1213));
        // The note of a trigger's line, after the error: not the error.
        assert_eq!(
            reported_number(&deadlock, Some(noted(4094, "At line 1 in db.t"))),
            None
        );
        assert_eq!(reported_number(&deadlock, None), None);
    }

    #[test]
    fn a_galera_node_not_ready_is_told_by_number_and_text_together() {
        let not_ready = unknown("WSREP has not yet prepared node for application use");
        assert_eq!(
            mysql_retry_reason_given(&not_ready, Some(1047)),
            Some(RetryReason::NodeNotReady)
        );
        let not_primary = unknown(
            "Error while appending streaming replication fragment\
             (provider status: Not connected to Primary Component)",
        );
        assert_eq!(
            mysql_retry_reason_given(&not_primary, Some(1180)),
            Some(RetryReason::NodeNotReady)
        );
        // The same text under a trigger's own number is the trigger's refusal.
        assert_eq!(mysql_retry_reason_given(&not_ready, Some(1644)), None);
        // Another commit error is not a node that was not ready.
        assert_eq!(
            mysql_retry_reason_given(&unknown("Error during commit"), Some(1180)),
            None
        );
    }
}
