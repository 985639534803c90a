//! The thin layer that sends the library's statements on a diesel-async connection of a
//! server backend ([`NativeAsync`]): the same statement types the blocking executor sends,
//! awaited instead of run.

use std::future::Future;

use diesel::dsl::{AsSelect, Filter, Select};
use diesel::query_builder::{QueryFragment, QueryId};
use diesel::query_dsl::methods::{FilterDsl, SelectDsl};
use diesel::query_source::QuerySource;
use diesel::{OptionalExtension, QueryResult, Selectable, SelectableHelper};
use diesel_async::methods::{ExecuteDsl, LoadQuery};
use diesel_async::{AsyncConnection, RunQueryDsl};

use super::connection::{in_transaction, NativeAsync, NativeAsyncConnection};
use crate::connect::backend::OccBackend;
use crate::guard::Guarded;
use crate::sql::names::table_name;
use crate::sql::new_token::{Counted, ReadAfter, ReturnedBy, ReturnedVersion};
use crate::sql::statement::{LatestRead, RowLock};
use crate::sql::values_update::{RowAndToken, RowOnly, Template, ValuesUpdate};
use crate::write::entity::{rows_by_keys, RowsByKeys};

/// The reads of an entity's row by key on async connection `C`, as
/// [`LoadByKey`](crate::LoadByKey) does them on a blocking one.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be read by key on `{C}`",
    note = "the connection must be a diesel-async connection of a backend diesel-occ supports (`AsyncPgConnection`, `AsyncMysqlConnection`, `SyncConnectionWrapper<SqliteConnection>`, or a pool's connection of one)"
)]
pub trait AsyncLoadByKey<C>: Guarded {
    /// The row with `key` as last committed (locked inside a transaction).
    #[doc(hidden)]
    fn load_by_key(
        conn: &mut C,
        key: &Self::Key,
    ) -> impl Future<Output = QueryResult<Option<Self>>> + Send;

    /// The row with `key`, by a plain read.
    #[doc(hidden)]
    fn read_by_key(
        conn: &mut C,
        key: &Self::Key,
    ) -> impl Future<Output = QueryResult<Option<Self>>> + Send;

    /// The row with `key` read with the row lock `lock`.
    #[doc(hidden)]
    fn lock_by_key(
        conn: &mut C,
        key: &Self::Key,
        lock: RowLock,
    ) -> impl Future<Output = QueryResult<Option<Self>>> + Send;

    /// The rows with any of `keys` that exist, in one statement (locked inside a
    /// transaction).
    #[doc(hidden)]
    fn load_by_keys(
        conn: &mut C,
        keys: &[Self::Key],
    ) -> impl Future<Output = QueryResult<Vec<Self>>> + Send;

    /// The table's SQL name, for messages.
    #[doc(hidden)]
    fn table_name() -> &'static str;
}

/// The `SELECT` of entity `T`'s row by key on backend `DB`.
type SelectByKey<T, DB> = Select<
    Filter<<T as diesel::associations::HasTable>::Table, <T as Guarded>::KeyPredicate>,
    AsSelect<T, DB>,
>;

/// The read of entity `T`'s row by key on backend `DB`.
type ByKey<T, DB> = LatestRead<
    Select<
        Filter<<T as diesel::associations::HasTable>::Table, <T as Guarded>::KeyPredicate>,
        AsSelect<T, DB>,
    >,
>;

impl<T, C> AsyncLoadByKey<C> for T
where
    T: Guarded + Selectable<C::Backend>,
    C: AsyncConnection,
    C: NativeAsyncConnection,
    C::Backend: NativeAsync,
    T::Table: 'static,
    <T::Table as QuerySource>::FromClause: QueryFragment<C::Backend>,
    T::SelectExpression: QueryId,
    T::Table: FilterDsl<T::KeyPredicate>,
    Filter<T::Table, T::KeyPredicate>: SelectDsl<AsSelect<T, C::Backend>>,
    ByKey<T, C::Backend>: LoadQuery<'static, C, T> + Send + 'static,
    T::Table: FilterDsl<T::KeysPredicate>,
    Filter<T::Table, T::KeysPredicate>: SelectDsl<AsSelect<T, C::Backend>>,
    RowsByKeys<T, C::Backend>: LoadQuery<'static, C, T> + Send + 'static,
{
    async fn load_by_key(conn: &mut C, key: &T::Key) -> QueryResult<Option<T>> {
        let locking = in_transaction(conn);
        by_key::<T, C::Backend, _>(key, LatestRead::new, locking)
            .get_result(conn)
            .await
            .optional()
    }

    async fn read_by_key(conn: &mut C, key: &T::Key) -> QueryResult<Option<T>> {
        by_key::<T, C::Backend, _>(key, LatestRead::new, false)
            .get_result(conn)
            .await
            .optional()
    }

    async fn lock_by_key(conn: &mut C, key: &T::Key, lock: RowLock) -> QueryResult<Option<T>> {
        by_key::<T, C::Backend, _>(key, LatestRead::locked, lock)
            .get_result(conn)
            .await
            .optional()
    }

    async fn load_by_keys(conn: &mut C, keys: &[T::Key]) -> QueryResult<Vec<T>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let locking = in_transaction(conn);
        rows_by_keys::<T, C::Backend>(keys, locking)
            .load(conn)
            .await
    }

    fn table_name() -> &'static str {
        table_name::<T::Table, C::Backend>(&T::table())
    }
}

/// The read of the row with `key`, made by `read` with `how` (locking or not).
fn by_key<T, DB, How>(
    key: &T::Key,
    read: fn(SelectByKey<T, DB>, How) -> ByKey<T, DB>,
    how: How,
) -> ByKey<T, DB>
where
    T: Guarded + Selectable<DB>,
    DB: diesel::backend::Backend,
    T::SelectExpression: QueryId,
    T::Table: FilterDsl<T::KeyPredicate>,
    Filter<T::Table, T::KeyPredicate>: SelectDsl<AsSelect<T, DB>>,
{
    let filtered = FilterDsl::filter(T::table(), T::key_predicate(key));
    read(SelectDsl::select(filtered, T::as_select()), how)
}

/// Sends a guarded statement on async connection `C`, as
/// the blocking executor runs it on a blocking one: the rows it
/// matched and, for kinds whose next token only the database knows, that token.
#[diagnostic::on_unimplemented(
    message = "this guard cannot run its statement on `{C}`",
    note = "the statement, its guard's assignments or the token's column type do not fit this connection's backend"
)]
pub trait AsyncComplete<C, S, Tok> {
    /// Sends `statement` on `conn`; `own` says whether `conn`'s open transaction, if any,
    /// is the library's.
    fn run(
        conn: &mut C,
        statement: S,
        own: bool,
    ) -> impl Future<Output = QueryResult<(usize, Option<Tok>)>> + Send;
}

impl<C, S, Tok> AsyncComplete<C, S, Tok> for Counted
where
    C: AsyncConnection,
    S: ExecuteDsl<C> + Send + 'static,
{
    async fn run(conn: &mut C, statement: S, _own: bool) -> QueryResult<(usize, Option<Tok>)> {
        ExecuteDsl::execute(statement, conn)
            .await
            .map(|rows| (rows, None))
    }
}

impl<C, S, Col, Tok> AsyncComplete<C, S, Tok> for ReturnedBy<Col>
where
    C: AsyncConnection,
    C::Backend: AsyncReadsBack<C, S, Col, Tok>,
{
    fn run(
        conn: &mut C,
        statement: S,
        own: bool,
    ) -> impl Future<Output = QueryResult<(usize, Option<Tok>)>> + Send {
        <C::Backend as AsyncReadsBack<C, S, Col, Tok>>::run(conn, statement, own)
    }
}

/// A version advanced in SQL: PostgreSQL returns it; MySQL notes it in the session's
/// `LAST_INSERT_ID` and reads the note, as the blocking path does.
impl<C, S, Col, Tok> AsyncComplete<C, S, Tok> for ReturnedVersion<Col>
where
    C: AsyncConnection,
    C::Backend: AsyncReadsVersionBack<C, S, Col, Tok>,
{
    fn run(
        conn: &mut C,
        statement: S,
        own: bool,
    ) -> impl Future<Output = QueryResult<(usize, Option<Tok>)>> + Send {
        <C::Backend as AsyncReadsVersionBack<C, S, Col, Tok>>::run(conn, statement, own)
    }
}

/// How backend `Self` sends `statement` and reads back the version it left in `Col`:
/// `RETURNING` on PostgreSQL; on MySQL the statement notes the version in the session's
/// `LAST_INSERT_ID` and one read takes the note and restores the caller's value.
#[diagnostic::on_unimplemented(
    message = "this version guard cannot read its new version back on `{Self}`",
    note = "the statement, its guard's assignments or the version's column type do not fit this connection's backend"
)]
pub trait AsyncReadsVersionBack<C, S, Col, Tok> {
    /// Sends `statement` on `conn`: the rows it matched and the version it left. `own`:
    /// whether `conn`'s open transaction, if any, is the library's.
    fn run(
        conn: &mut C,
        statement: S,
        own: bool,
    ) -> impl Future<Output = QueryResult<(usize, Option<Tok>)>> + Send;
}

#[cfg(feature = "postgres")]
impl<C, S, Col, Tok> AsyncReadsVersionBack<C, S, Col, Tok> for diesel::pg::Pg
where
    diesel::pg::Pg: AsyncReadsBack<C, S, Col, Tok>,
{
    fn run(
        conn: &mut C,
        statement: S,
        own: bool,
    ) -> impl Future<Output = QueryResult<(usize, Option<Tok>)>> + Send {
        <diesel::pg::Pg as AsyncReadsBack<C, S, Col, Tok>>::run(conn, statement, own)
    }
}

/// The statement noting its version, then the read of the note, as the blocking path.
#[cfg(feature = "async-mysql")]
impl<C, T, Changes, Advance, Key, Guard, Col, Tok>
    AsyncReadsVersionBack<
        C,
        crate::sql::statement::GuardedUpdate<T, Changes, Advance, Key, Guard>,
        Col,
        Tok,
    > for diesel::mysql::Mysql
where
    C: AsyncConnection<Backend = Self>,
    T: diesel::Table,
    Tok: crate::guard::version::VersionNumber,
    crate::sql::statement::GuardedUpdate<T, Changes, Advance, Key, Guard>: Send,
    crate::sql::statement::NotingVersion<T, Changes, Advance, Key, Guard, Col>:
        ExecuteDsl<C> + Send + 'static,
    crate::sql::statement::ReadNotedVersion:
        LoadQuery<'static, C, crate::sql::statement::NotedVersion>,
{
    async fn run(
        conn: &mut C,
        statement: crate::sql::statement::GuardedUpdate<T, Changes, Advance, Key, Guard>,
        _own: bool,
    ) -> QueryResult<(usize, Option<Tok>)> {
        use crate::sql::statement::{NotedVersion, ReadNotedVersion};
        match ExecuteDsl::execute(statement.noting_version::<Col>(), conn).await? {
            0 => Ok((0, None)),
            1 => {
                let noted: NotedVersion = ReadNotedVersion.get_result(conn).await?;
                Ok((1, Some(noted.version()?)))
            }
            // A key of several rows (the write is then refused): restore the caller's value too.
            rows => ReadNotedVersion
                .get_result::<NotedVersion>(conn)
                .await
                .map(|_| (rows, None)),
        }
    }
}

/// A token other code maintains: PostgreSQL returns it as its `BEFORE` triggers left it;
/// MySQL reads it back in the write's transaction.
impl<C, S, Col, Tok> AsyncComplete<C, S, Tok> for ReadAfter<Col>
where
    C: AsyncConnection,
    C::Backend: AsyncReadsBack<C, S, Col, Tok>,
{
    fn run(
        conn: &mut C,
        statement: S,
        own: bool,
    ) -> impl Future<Output = QueryResult<(usize, Option<Tok>)>> + Send {
        <C::Backend as AsyncReadsBack<C, S, Col, Tok>>::run(conn, statement, own)
    }
}

/// Sends guarded statements of distinct rows on async connection `C` in as few statements
/// as the backend allows, as the blocking path's batches do: the index of each statement
/// that wrote its row and, for kinds whose next token only the database knows, that
/// token.
#[diagnostic::on_unimplemented(
    message = "this guard cannot run a batch of its statements on `{C}`",
    note = "the statement, its guard's assignments or the token's column type do not fit this connection's backend"
)]
pub trait AsyncCompleteEach<C, S, Tok> {
    /// Sends `updates` on `conn`; they must not share a key.
    fn run_each(
        conn: &mut C,
        updates: Vec<S>,
    ) -> impl Future<Output = QueryResult<Vec<(usize, Option<Tok>)>>> + Send;
}

impl<C, S, Tok> AsyncCompleteEach<C, S, Tok> for Counted
where
    C: AsyncConnection,
    C::Backend: OccBackend,
    S: QueryFragment<C::Backend> + Template<C::Backend> + Send,
    ValuesUpdate<S, RowOnly>: LoadQuery<'static, C, i32> + Send + 'static,
    Tok: Send,
{
    async fn run_each(conn: &mut C, updates: Vec<S>) -> QueryResult<Vec<(usize, Option<Tok>)>> {
        let mut written = Vec::new();
        for statement in ValuesUpdate::<S, RowOnly>::group::<C::Backend>(updates)? {
            let rows: Vec<i32> = statement.load(conn).await?;
            written.extend(rows.into_iter().map(|row| (row as usize, None)));
        }
        Ok(written)
    }
}

/// The blocking path's batches with their tokens: PostgreSQL's `RETURNING` sees what
/// `BEFORE` triggers set, and only PostgreSQL sends batches.
macro_rules! complete_each_returning {
    ($kind:ident) => {
        impl<C, S, Col, Tok> AsyncCompleteEach<C, S, Tok> for $kind<Col>
        where
            C: AsyncConnection,
            C::Backend: OccBackend,
            Col: diesel::Column,
            S: QueryFragment<C::Backend> + Template<C::Backend> + Send,
            ValuesUpdate<S, RowAndToken<Col>>: LoadQuery<'static, C, (i32, Tok)> + Send + 'static,
            Tok: Send,
        {
            async fn run_each(
                conn: &mut C,
                updates: Vec<S>,
            ) -> QueryResult<Vec<(usize, Option<Tok>)>> {
                let mut written = Vec::new();
                for statement in ValuesUpdate::<S, RowAndToken<Col>>::group::<C::Backend>(updates)?
                {
                    let rows: Vec<(i32, Tok)> = statement.load(conn).await?;
                    written.extend(
                        rows.into_iter()
                            .map(|(row, token)| (row as usize, Some(token))),
                    );
                }
                Ok(written)
            }
        }
    };
}

complete_each_returning!(ReturnedBy);
complete_each_returning!(ReadAfter);

/// How backend `Self` sends `statement` and reads back the column `Col` it set.
#[diagnostic::on_unimplemented(
    message = "this guard cannot read its new token back on `{Self}`",
    note = "an `xmin` guard is PostgreSQL's; a last-modified guard on the database's clock reads its stamp back on every backend"
)]
pub trait AsyncReadsBack<C, S, Col, Tok> {
    /// Sends `statement` on `conn`: the rows it matched and the token it left. `own`:
    /// whether `conn`'s open transaction, if any, is the library's.
    fn run(
        conn: &mut C,
        statement: S,
        own: bool,
    ) -> impl Future<Output = QueryResult<(usize, Option<Tok>)>> + Send;
}

/// `<statement> RETURNING <Col>`: one round trip.
#[cfg(feature = "postgres")]
impl<C, S, Col, Tok> AsyncReadsBack<C, S, Col, Tok> for diesel::pg::Pg
where
    C: AsyncConnection<Backend = Self>,
    crate::sql::new_token::Returning<S, Col>: LoadQuery<'static, C, Tok> + 'static,
    S: Send,
    Tok: Send,
{
    async fn run(conn: &mut C, statement: S, _own: bool) -> QueryResult<(usize, Option<Tok>)> {
        let tokens: Vec<Tok> = crate::sql::new_token::Returning::new(statement)
            .load(conn)
            .await?;
        Ok((tokens.len(), tokens.into_iter().next()))
    }
}

/// No `RETURNING`: the statement, then `SELECT <Col>` of its row, in one transaction.
#[cfg(feature = "async-mysql")]
impl<C, T, Changes, Advance, Key, Guard, Col, Tok>
    AsyncReadsBack<
        C,
        crate::sql::statement::GuardedUpdate<T, Changes, Advance, Key, Guard>,
        Col,
        Tok,
    > for diesel::mysql::Mysql
where
    C: AsyncConnection<Backend = Self>,
    T: diesel::Table,
    T::FromClause: Clone,
    Key: Clone,
    crate::sql::statement::GuardedUpdate<T, Changes, Advance, Key, Guard>:
        ExecuteDsl<C> + Send + 'static,
    crate::sql::statement::ColumnOfRow<T, Key, Col>: LoadQuery<'static, C, Tok> + Send + 'static,
    Tok: Send + 'static,
{
    async fn run(
        conn: &mut C,
        statement: crate::sql::statement::GuardedUpdate<T, Changes, Advance, Key, Guard>,
        own: bool,
    ) -> QueryResult<(usize, Option<Tok>)> {
        let read = statement.read_back::<Col>();
        // Inside a transaction the library opened, the two already go or stay together; a
        // savepoint would only add a statement a cluster's abort can fail in (a Galera
        // node that aborted the transaction answers `SAVEPOINT ... does not exist`).
        if own && super::connection::in_transaction(conn) {
            return match ExecuteDsl::execute(statement, conn).await? {
                1 => match read.get_result(conn).await {
                    Ok(token) => Ok((1, Some(token))),
                    Err(diesel::result::Error::NotFound) => {
                        Err(crate::sql::new_token::aborted_under_write())
                    }
                    Err(other) => Err(other),
                },
                rows => Ok((rows, None)),
            };
        }
        let mut transaction = super::transaction::OwnTransaction::begin_raw(conn).await?;
        let written = match ExecuteDsl::execute(statement, transaction.conn()).await {
            Ok(1) => read
                .get_result(transaction.conn())
                .await
                .map(|token| (1, Some(token))),
            Ok(rows) => Ok((rows, None)),
            Err(e) => Err(e),
        };
        transaction.finish(written, |e| e).await
    }
}
