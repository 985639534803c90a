//! What the async path needs of a diesel-async connection beyond sending statements: its
//! transaction state, the classification of its errors, and (PostgreSQL, MySQL) the read
//! of a time column's declared digits.

use std::future::Future;

use diesel::result::Error as DieselError;
use diesel::QueryResult;
use diesel_async::{AsyncConnection, TransactionManager};

use crate::connect::backend::OccBackend;
use crate::error::Error;
use crate::flow::compare_and_set::{classify_given, Classifier};
use crate::guard::stored_precision::PrecisionCheck;
use crate::guard::Guarded;

/// A backend whose diesel-async connections talk to the server themselves (PostgreSQL,
/// MySQL): the library's statements are sent on them one by one. SQLite's connection is a
/// blocking one on a thread of its own (`SyncConnectionWrapper`): there each operation of
/// the library runs whole on that thread, as the blocking API runs it.
pub trait NativeAsync: OccBackend {
    /// Whether a statement whose future is dropped half way leaves the connection usable
    /// (PostgreSQL's client reads the rest of the reply itself; MySQL's does not).
    #[doc(hidden)]
    const STATEMENTS_SURVIVE_CANCELLATION: bool;

    /// How many fractional digits of a second the column `column` of `table` (in
    /// `schema`, or the connection's own) declares.
    #[doc(hidden)]
    fn stored_second_digits<C>(
        conn: &mut C,
        schema: Option<&'static str>,
        table: &'static str,
        column: &'static str,
    ) -> impl Future<Output = QueryResult<Option<u32>>> + Send
    where
        C: AsyncConnection<Backend = Self>;

    /// [`OccBackend::applies_writes_late`], asked on an async connection.
    #[doc(hidden)]
    fn applies_writes_late<C>(conn: &mut C) -> impl Future<Output = bool> + Send
    where
        C: AsyncConnection<Backend = Self>;
}

/// A diesel-async connection that talks to its server itself (`AsyncPgConnection`,
/// `AsyncMysqlConnection`): the library's statements are sent on it one by one. Not
/// nameable outside the crate (a caller names
/// [`AsyncWriteConnection`](super::AsyncWriteConnection)); it keeps these connections'
/// implementations apart from SQLite's, which runs the blocking path on its thread.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a diesel-async connection diesel-occ runs on",
    note = "the async API runs on `AsyncPgConnection`, `AsyncMysqlConnection` (feature `async-mysql`) and `SyncConnectionWrapper<SqliteConnection>`",
    note = "if this is a pool's guard (a bb8 `PooledConnection`, a deadpool `Object`), pass the connection inside it: `&mut *conn`",
    note = "a blocking diesel connection takes the blocking API: `use diesel_occ::prelude::*`"
)]
pub trait NativeAsyncConnection: AsyncConnection {}

#[cfg(feature = "postgres")]
impl NativeAsyncConnection for diesel_async::AsyncPgConnection {}
#[cfg(feature = "async-mysql")]
impl NativeAsyncConnection for diesel_async::AsyncMysqlConnection {}

/// Implements [`NativeAsync`] for a backend whose declared digits `sql` reads.
#[cfg(any(feature = "postgres", feature = "async-mysql"))]
macro_rules! native_async {
    ($backend:ty, $sql:expr, $survives:expr, $late:expr) => {
        impl NativeAsync for $backend {
            const STATEMENTS_SURVIVE_CANCELLATION: bool = $survives;

            async fn applies_writes_late<C>(conn: &mut C) -> bool
            where
                C: AsyncConnection<Backend = Self>,
            {
                use diesel_async::RunQueryDsl;
                match $late {
                    // The server's own answer; an error (MySQL has no such variable)
                    // means no.
                    Some(sql) => diesel::select(diesel::dsl::sql::<diesel::sql_types::Bool>(sql))
                        .get_result::<bool>(conn)
                        .await
                        .unwrap_or(false),
                    None => false,
                }
            }

            async fn stored_second_digits<C>(
                conn: &mut C,
                schema: Option<&'static str>,
                table: &'static str,
                column: &'static str,
            ) -> QueryResult<Option<u32>>
            where
                C: AsyncConnection<Backend = Self>,
            {
                use crate::connect::backend::{declared_digits_query, DeclaredDigits};
                use diesel::OptionalExtension;
                use diesel_async::RunQueryDsl;
                let query = declared_digits_query::<Self>($sql, schema, table, column);
                let found = query.get_result::<DeclaredDigits>(conn).await.optional()?;
                Ok(DeclaredDigits::of(found))
            }
        }
    };
}

#[cfg(feature = "postgres")]
native_async!(
    diesel::pg::Pg,
    crate::connect::backend::PG_DECLARED_DIGITS,
    true,
    None::<&str>
);
#[cfg(feature = "async-mysql")]
native_async!(
    diesel::mysql::Mysql,
    crate::connect::backend::MYSQL_DECLARED_DIGITS,
    false,
    Some(crate::connect::backend::APPLIES_WRITES_LATE)
);

/// Whether `conn` has an open transaction.
pub(crate) fn in_transaction<C: AsyncConnection>(conn: &mut C) -> bool {
    C::TransactionManager::transaction_manager_status_mut(conn)
        .transaction_depth()
        .map(|depth| depth.is_some())
        .unwrap_or(false)
}

/// [`Error::Database`] with diesel's `BrokenTransactionManager` when an earlier call on
/// `conn` was cancelled inside a transaction of the library's and left it open: nothing is
/// sent on such a connection (bb8 and the library's deadpool checkouts close it when it
/// goes back; a connection of the caller's must be dropped, which ends the transaction on
/// the server).
pub(crate) fn refuse_broken<C: AsyncConnection>(conn: &mut C) -> Result<(), Error> {
    C::TransactionManager::transaction_manager_status_mut(conn)
        .transaction_depth()
        .map(drop)
        .map_err(Error::Database)
}

/// Classifies an error a statement returned on `conn`, as the blocking executor does:
/// diesel-async keeps only MySQL's message text, so there the server is asked for the
/// error's number, as the blocking path asks it ([`OccBackend::retry_reason`]).
pub(crate) async fn classify<C>(conn: &mut C, error: DieselError) -> Error
where
    C: AsyncConnection,
    C::Backend: OccBackend,
{
    let inside = in_transaction(conn);
    discard_if_lost(conn, &error);
    let error = crate::connect::reply_bound::name_the_cut(conn.instrumentation(), error);
    if let DieselError::DeserializationError(cause) = &error {
        if crate::error::is_cut_short(&**cause) {
            // A reply without its rows: the connection is out of step, asked nothing
            // more, and discarded (see `answer_cut_short`).
            C::TransactionManager::transaction_manager_status_mut(conn).set_in_error();
            return classify_given(error, inside, |_| None);
        }
    }
    let reason = C::Backend::retry_reason_async(conn, &error).await;
    classify_given(error, inside, |_| reason)
}

/// Marks `conn` broken when `error` says its connection is gone, so that no pool hands
/// it out again: diesel-async's MySQL connection does not say so itself (a connection
/// the server dropped, or one the reply timeout closed, went back into bb8 and failed
/// every later checkout when the pool's own check on checkout was off).
pub(crate) fn discard_if_lost<C: AsyncConnection>(conn: &mut C, error: &DieselError) {
    if crate::error::connection_lost(error) {
        C::TransactionManager::transaction_manager_status_mut(conn).set_in_error();
    }
}

/// [`classify`] made ready for `error`, the one a judgement that takes the
/// classification as a closure may hand it: the server is asked before the judgement runs.
pub(crate) async fn classifier<C>(conn: &mut C, error: Option<&DieselError>) -> Classifier
where
    C: AsyncConnection,
    C::Backend: OccBackend,
{
    let in_transaction = in_transaction(conn);
    if let Some(error) = error {
        discard_if_lost(conn, error);
    }
    let reason = match error {
        Some(DieselError::DeserializationError(cause)) if crate::error::is_cut_short(&**cause) => {
            // As `classify`: the connection is out of step and discarded.
            C::TransactionManager::transaction_manager_status_mut(conn).set_in_error();
            None
        }
        Some(error) => C::Backend::retry_reason_async(conn, error).await,
        None => None,
    };
    Classifier {
        in_transaction,
        reason,
    }
}

/// `result`, its error [classified](classify) on `conn`.
pub(crate) async fn classified<C, T>(conn: &mut C, result: QueryResult<T>) -> Result<T, Error>
where
    C: AsyncConnection,
    C::Backend: OccBackend,
{
    match result {
        Ok(value) => Ok(value),
        Err(error) => Err(classify(conn, error).await),
    }
}

/// The check that a time token's column keeps every digit (the blocking path's), with
/// the column's declared digits read over `conn`.
pub(crate) async fn check_stored_precision<T, C>(
    conn: &mut C,
    table: &'static str,
) -> Result<(), Error>
where
    T: Guarded,
    C: AsyncConnection,
    C: NativeAsyncConnection,
    C::Backend: NativeAsync,
{
    run_precision_check(conn, PrecisionCheck::of::<T, C::Backend>(table)).await
}

/// Reads the column of `check` (if any) over `conn` and judges it.
pub(crate) async fn run_precision_check<C>(
    conn: &mut C,
    check: Option<PrecisionCheck>,
) -> Result<(), Error>
where
    C: AsyncConnection,
    C: NativeAsyncConnection,
    C::Backend: NativeAsync,
{
    let Some(check) = check else {
        return Ok(());
    };
    let (schema, name, column) = check.column();
    let stored =
        <C::Backend as NativeAsync>::stored_second_digits(conn, schema, name, column).await;
    let stored = classified(conn, stored).await?;
    check.judge(stored)
}
