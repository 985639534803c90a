//! The drive traits on diesel-async connections: [`Io`] on those that talk to their
//! server themselves (PostgreSQL, MySQL), and a flow's own write transaction
//! ([`WriteAttempt`]) and reads ([`ReadRow`]) on every one, SQLite's included (its
//! statements run on its thread).

pub(crate) mod connection;
pub(crate) mod executor;
pub(crate) mod send;
pub(crate) mod transaction;

use std::future::Future;
use std::time::Duration;

use diesel::result::Error as DieselError;
use diesel::QueryResult;
use diesel_async::methods::{ExecuteDsl, LoadQuery};
use diesel_async::RunQueryDsl;

use diesel_async::AsyncConnection;

use super::{
    Attempts, Body, End, Ended, ExecuteOn, Io, QueryOn, ReadOn, ReadRow, RunEachOn, RunOn,
    Transactions, WriteAttempt,
};
#[cfg(feature = "locks")]
use crate::connect::reply_bound::Tightened;
use crate::connect::transaction::LostCommit;
use crate::drive::on_async::connection::{
    classified, classifier, classify, in_transaction, refuse_broken, NativeAsync,
    NativeAsyncConnection,
};
use crate::drive::on_async::executor::{protect_caller, run, AsyncMiss};
use crate::drive::on_async::send::{AsyncComplete, AsyncCompleteEach, AsyncLoadByKey};
use crate::drive::on_async::transaction::{BeginWrite, Call, OwnTransaction};
use crate::error::Error;
use crate::flow::compare_and_set::{Classifier, CompareAndSet, Written};
use crate::sql::statement::{Assignments, RowLock};
use connection::check_stored_precision;

impl<C> Io for C
where
    C: NativeAsyncConnection,
    C::Backend: NativeAsync,
{
    type Backend = C::Backend;

    fn in_transaction(&mut self) -> bool {
        in_transaction(self)
    }

    fn refuse_broken(&mut self) -> Result<(), Error> {
        refuse_broken(self)
    }

    #[cfg(feature = "locks")]
    fn tighten_replies(&mut self, limit: Duration) -> Option<Tightened> {
        crate::connect::reply_bound::tighten(self.instrumentation(), limit)
    }

    fn classify(&mut self, error: DieselError) -> impl Future<Output = Error> + Send {
        classify(self, error)
    }

    fn pause(&mut self, pause: Duration) -> impl Future<Output = ()> + Send {
        tokio::time::sleep(pause)
    }

    async fn protect_caller<'a, 'c, T, F>(&'c mut self, own: bool, body: F) -> Result<T, Error>
    where
        for<'r> F: Body<&'r mut Self, QueryResult<T>, Fut: Send> + Send + 'a,
        T: Send + 'a,
        'a: 'c,
    {
        let sent = protect_caller(self, own, body).await?;
        classified(self, sent).await
    }

    async fn call<'a, 'c, T, F>(&'c mut self, body: F) -> T
    where
        for<'r> F: Body<&'r mut Self, T, Fut: Send> + Send + 'a,
        T: Send + 'a,
        'a: 'c,
    {
        let mut call = Call::start(self);
        let done = body(call.conn()).await;
        call.finish(done)
    }
}

impl<C> Transactions for C
where
    C: NativeAsyncConnection,
    C::Backend: NativeAsync,
{
    async fn own_transaction<'a, 'c, T, E, F>(&'c mut self, body: F) -> Result<T, E>
    where
        for<'r> F: Body<&'r mut Self, Result<T, E>, Fut: Send> + Send + 'a,
        T: Send + 'a,
        E: From<Error> + From<DieselError> + LostCommit + Send + 'a,
        'a: 'c,
    {
        let mut transaction = OwnTransaction::begin(self).await?;
        let done = body(transaction.conn()).await;
        transaction.settle(done).await
    }
}

impl<T, C> ReadOn<C> for T
where
    T: AsyncLoadByKey<C>,
    C: NativeAsyncConnection,
    C::Backend: NativeAsync,
{
    fn table_name() -> &'static str {
        <T as AsyncLoadByKey<C>>::table_name()
    }

    fn load_by_key(
        conn: &mut C,
        key: &T::Key,
    ) -> impl Future<Output = QueryResult<Option<T>>> + Send {
        <T as AsyncLoadByKey<C>>::load_by_key(conn, key)
    }

    fn load_by_keys(
        conn: &mut C,
        keys: &[T::Key],
    ) -> impl Future<Output = QueryResult<Vec<T>>> + Send {
        <T as AsyncLoadByKey<C>>::load_by_keys(conn, keys)
    }

    fn check_stored_precision(conn: &mut C) -> impl Future<Output = Result<(), Error>> + Send {
        check_stored_precision::<T, C>(conn, <T as AsyncLoadByKey<C>>::table_name())
    }
}

impl<Q, C, U> QueryOn<C, U> for Q
where
    Q: LoadQuery<'static, C, U> + Send + 'static,
    C: NativeAsyncConnection,
    U: Send,
{
    fn load_on(self, conn: &mut C) -> impl Future<Output = QueryResult<Vec<U>>> + Send {
        RunQueryDsl::load(self, conn)
    }
}

impl<S, C> ExecuteOn<C> for S
where
    S: ExecuteDsl<C> + Send + 'static,
    C: NativeAsyncConnection,
{
    fn execute_on(self, conn: &mut C) -> impl Future<Output = QueryResult<usize>> + Send {
        ExecuteDsl::execute(self, conn)
    }
}

impl<K, C, S, M, Tok> RunOn<C, S, M, Tok> for K
where
    C: NativeAsyncConnection,
    C::Backend: NativeAsync,
    S: Assignments<C::Backend> + Send,
    K: AsyncComplete<C, S, Tok>,
    M: AsyncMiss<C> + Send,
    Tok: Send,
{
    fn run(
        conn: &mut C,
        write: CompareAndSet<'_, S, M>,
        own: bool,
    ) -> impl Future<Output = Result<Written<Tok>, Error>> + Send {
        run::<C, S, M, K, Tok>(write, conn, own)
    }
}

/// Every diesel-async connection, SQLite's included (its statements run on its thread).
impl<C> WriteAttempt for C
where
    C: BeginWrite,
{
    type Backend = C::Backend;

    fn caller_transaction(&mut self) -> Result<bool, Error> {
        refuse_broken(self)?;
        Ok(in_transaction(self))
    }

    /// Dropped half way, the transaction marks the connection broken
    /// ([`OwnTransaction`]).
    async fn write_transaction<T, F>(&mut self, body: F) -> Ended<T>
    where
        for<'r> F: Body<&'r mut Self, (End, T)>,
    {
        let mut transaction = match OwnTransaction::begin_write(self).await {
            Ok(transaction) => transaction,
            Err(error) => return Ended::NotBegun(error),
        };
        match body(transaction.conn()).await {
            (End::Commit, value) => Ended::Committed(value, transaction.commit().await),
            (End::Rollback, value) => Ended::RolledBack(value, transaction.rollback().await),
        }
    }

    fn classifier(&mut self, error: Option<&DieselError>) -> impl Future<Output = Classifier> {
        classifier(self, error)
    }

    fn discard(&mut self) {
        use diesel_async::TransactionManager;
        C::TransactionManager::transaction_manager_status_mut(self).set_in_error();
    }
}

impl<T, C> ReadRow<C> for T
where
    T: AsyncLoadByKey<C>,
    C: AsyncConnection,
{
    fn table_name() -> &'static str {
        <T as AsyncLoadByKey<C>>::table_name()
    }

    async fn read_row(conn: &mut C, key: &T::Key, lock: RowLock) -> QueryResult<Option<T>> {
        match lock {
            RowLock::None => T::read_by_key(conn, key).await,
            lock => T::lock_by_key(conn, key, lock).await,
        }
    }
}

/// Every attempt on the caller's connection; the pauses between them sleep on tokio's
/// timer.
pub(crate) struct Caller<'c, C>(pub(crate) &'c mut C);

impl<C: BeginWrite> Attempts<C> for Caller<'_, C> {
    const FRESH_PER_ATTEMPT: bool = false;

    fn caller_transaction(&mut self) -> Result<bool, Error> {
        self.0.caller_transaction()
    }

    async fn attempt<T, F>(&mut self, body: F) -> Result<T, Error>
    where
        for<'r> F: Body<&'r mut C, T>,
    {
        Ok(body(self.0).await)
    }

    fn pause(&mut self, pause: Duration) -> impl Future<Output = ()> {
        tokio::time::sleep(pause)
    }
}

impl<K, C, S, Tok> RunEachOn<C, S, Tok> for K
where
    C: NativeAsyncConnection,
    K: AsyncCompleteEach<C, S, Tok>,
{
    fn run_each(
        conn: &mut C,
        statements: Vec<S>,
    ) -> impl Future<Output = QueryResult<Vec<(usize, Option<Tok>)>>> + Send {
        K::run_each(conn, statements)
    }
}
