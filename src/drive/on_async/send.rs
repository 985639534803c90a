//! The thin layer that sends the library's statements on a diesel-async connection of a
//! server backend ([`NativeAsync`]): the same statement types the blocking executor sends,
//! awaited instead of run.

use std::future::Future;

use diesel::dsl::{AsSelect, Filter};
use diesel::query_builder::{QueryFragment, QueryId};
use diesel::query_dsl::methods::{FilterDsl, SelectDsl};
use diesel::query_source::QuerySource;
use diesel::{OptionalExtension, QueryResult, Selectable};
use diesel_async::methods::{ExecuteDsl, LoadQuery};
use diesel_async::{AsyncConnection, RunQueryDsl};

use super::connection::{classify, in_transaction, NativeAsync, NativeAsyncConnection};
use super::transaction::Call;
use crate::connect::backend::OccBackend;
use crate::error::Error;
use crate::flow::row_read::{judge_read, needs_classifying};
use crate::guard::by_key::{by_key, rows_by_keys, ByKey, RowsByKeys};
use crate::guard::Guarded;
use crate::sql::names::table_name;
use crate::sql::new_token::{Counted, Executed, ReadAfter, ReturnedBy, TokenPlan};
use crate::sql::statement::{LatestRead, RowLock};
use crate::sql::values_update::{RowAndToken, RowOnly, Template, ValuesUpdate};

/// The reads of an entity's row by key on async connection `C`, as
/// [`LoadByKey`](crate::LoadByKey) does them on a blocking one.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be read by key on `{C}`",
    note = "the connection must be a diesel-async connection of a backend diesel-occ supports (`AsyncPgConnection`, `AsyncMysqlConnection`, `SyncConnectionWrapper<SqliteConnection>`)",
    note = "a connection checked out of a pool is passed as `&mut *conn` (the pool's guard is not the connection)"
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

    /// The row with `key`, by a plain read, or [`Error::NotFound`] naming the table and
    /// key (answered 404 by the `http` feature's `Problem`); as the blocking
    /// [`find_by_key`](crate::LoadByKey::find_by_key).
    fn find_by_key(
        conn: &mut C,
        key: &Self::Key,
    ) -> impl Future<Output = Result<Self, Error>> + Send
    where
        C: AsyncConnection,
        C::Backend: OccBackend,
    {
        async move {
            // A load reads every column: any of them may be the one that does not read.
            let suspects = "one of its columns";
            match Self::read_by_key(conn, key).await {
                Err(e) if needs_classifying(&e) => Err(classify(conn, e).await),
                read => judge_read(Self::table_name(), key, suspects, read, Error::Database),
            }
        }
    }
}

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
        let mut call = Call::start(conn);
        let read = by_key::<T, C::Backend, _>(key, LatestRead::new, locking)
            .get_result(call.conn())
            .await
            .optional();
        call.finish(read)
    }

    async fn read_by_key(conn: &mut C, key: &T::Key) -> QueryResult<Option<T>> {
        let mut call = Call::start(conn);
        let read = by_key::<T, C::Backend, _>(key, LatestRead::new, false)
            .get_result(call.conn())
            .await
            .optional();
        call.finish(read)
    }

    async fn lock_by_key(conn: &mut C, key: &T::Key, lock: RowLock) -> QueryResult<Option<T>> {
        let mut call = Call::start(conn);
        let read = by_key::<T, C::Backend, _>(key, LatestRead::locked, lock)
            .get_result(call.conn())
            .await
            .optional();
        call.finish(read)
    }

    async fn load_by_keys(conn: &mut C, keys: &[T::Key]) -> QueryResult<Vec<T>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let locking = in_transaction(conn);
        let mut call = Call::start(conn);
        let read = rows_by_keys::<T, C::Backend>(keys, locking)
            .load(call.conn())
            .await;
        call.finish(read)
    }

    fn table_name() -> &'static str {
        table_name::<T::Table, C::Backend>(&T::table())
    }
}

/// Sends a guarded statement on async connection `C`, as the blocking executor runs it on
/// a blocking one: the rows it matched and, for kinds whose next token only the database
/// knows, that token. The async driver of the backend's token plan: the plan, awaited.
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

impl<C, S, Tok, K> AsyncComplete<C, S, Tok> for K
where
    C: AsyncConnection,
    K: TokenPlan<C::Backend, S, Tok>,
    K::Plan: AsyncSendPlan<C, Tok>,
{
    fn run(
        conn: &mut C,
        statement: S,
        own: bool,
    ) -> impl Future<Output = QueryResult<(usize, Option<Tok>)>> + Send {
        K::plan(statement).send(conn, own)
    }
}

/// How the async driver sends a backend's token plan on connection `C`.
#[diagnostic::on_unimplemented(
    message = "this guard's statements cannot be sent on `{C}`",
    note = "the statement, its guard's assignments or the token's column type do not fit this connection's backend"
)]
pub trait AsyncSendPlan<C, Tok> {
    /// Sends the plan on `conn`: the rows the statement matched and the token it left.
    #[doc(hidden)]
    fn send(
        self,
        conn: &mut C,
        own: bool,
    ) -> impl Future<Output = QueryResult<(usize, Option<Tok>)>> + Send;
}

impl<C, S, Tok> AsyncSendPlan<C, Tok> for Executed<S>
where
    C: AsyncConnection,
    S: ExecuteDsl<C> + Send + 'static,
{
    async fn send(self, conn: &mut C, _own: bool) -> QueryResult<(usize, Option<Tok>)> {
        ExecuteDsl::execute(self.0, conn)
            .await
            .map(|rows| (rows, None))
    }
}

#[cfg(feature = "postgres")]
impl<C, S, Col, Tok> AsyncSendPlan<C, Tok> for crate::sql::new_token::Returning<S, Col>
where
    C: AsyncConnection,
    crate::sql::new_token::Returning<S, Col>: LoadQuery<'static, C, Tok> + Send + 'static,
    Tok: Send,
{
    async fn send(self, conn: &mut C, _own: bool) -> QueryResult<(usize, Option<Tok>)> {
        Ok(crate::flow::read_back::returned(self.load(conn).await?))
    }
}

#[cfg(feature = "async-mysql")]
impl<C, S, R, Tok> AsyncSendPlan<C, Tok> for crate::sql::new_token::ReadAfterWrite<S, R>
where
    C: NativeAsyncConnection,
    C::Backend: NativeAsync,
    S: ExecuteDsl<C> + Send + 'static,
    R: LoadQuery<'static, C, Tok> + Send + 'static,
    Tok: Send + 'static,
{
    async fn send(self, conn: &mut C, own: bool) -> QueryResult<(usize, Option<Tok>)> {
        use crate::flow::read_back::ReadBack;
        use crate::sql::new_token::ReadAfterWrite;
        let ReadAfterWrite { write, read } = self;
        let read_back = ReadBack::after_write(own, in_transaction(conn));
        if !read_back.nests() {
            let rows = ExecuteDsl::execute(write, conn).await?;
            if !read_back.written(rows) {
                return Ok((rows, None));
            }
            return read_back.read(read.get_result(conn).await);
        }
        let mut transaction = super::transaction::OwnTransaction::begin_raw(conn).await?;
        let written = async {
            let conn = transaction.conn();
            let rows = ExecuteDsl::execute(write, conn).await?;
            if !read_back.written(rows) {
                return Ok((rows, None));
            }
            read_back.read(read.get_result(conn).await)
        }
        .await;
        transaction.finish(written, |e| e).await
    }
}

#[cfg(feature = "async-mysql")]
impl<C, S, Tok> AsyncSendPlan<C, Tok> for crate::sql::new_token::NotedThenRead<S>
where
    C: AsyncConnection<Backend = diesel::mysql::Mysql>,
    S: ExecuteDsl<C> + Send + 'static,
    Tok: crate::guard::version::VersionNumber + Send,
    crate::sql::statement::ReadNotedVersion:
        LoadQuery<'static, C, crate::sql::statement::NotedVersion>,
{
    async fn send(self, conn: &mut C, _own: bool) -> QueryResult<(usize, Option<Tok>)> {
        use crate::flow::read_back::ReadBack;
        use crate::sql::statement::{NotedVersion, ReadNotedVersion};
        let rows = ExecuteDsl::execute(self.0, conn).await?;
        if !ReadBack::NOTE.written(rows) {
            return Ok((rows, None));
        }
        ReadBack::note(
            rows,
            ReadNotedVersion.get_result::<NotedVersion>(conn).await,
        )
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
pub(crate) trait AsyncCompleteEach<C, S, Tok> {
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
