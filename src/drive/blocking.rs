//! [`Io`] on a blocking diesel connection: each step runs when it is called.

pub(crate) mod complete;
pub(crate) mod executor;
pub(crate) mod load;

use std::future::{ready, Future};
use std::time::Duration;

use diesel::connection::LoadConnection;
use diesel::query_dsl::methods::{ExecuteDsl, LoadQuery};
use diesel::result::Error as DieselError;
use diesel::{Connection, QueryResult, RunQueryDsl};
use ref_cast::RefCast;

use super::{
    now, Attempts, Body, End, Ended, ExecuteOn, Io, QueryOn, ReadOn, ReadRow, RunEachOn, RunOn,
    Transactions, WriteAttempt,
};
use crate::connect::backend::OccBackend;
use crate::connect::caller_transaction::protect_caller;
#[cfg(feature = "locks")]
use crate::connect::reply_bound::Tightened;
use crate::connect::source::Connections;
use crate::connect::transaction::{commit_operation, in_transaction, LostCommit, WriteTransaction};
use crate::drive::blocking::complete::{Complete, CompleteEach};
use crate::drive::blocking::load::{check_stored_precision, LoadByKey};
use crate::error::Error;
use crate::flow::compare_and_set::{Classifier, CompareAndSet, Written};
use crate::sql::statement::{Assignments, RowLock};

use crate::drive::blocking::executor::{classify, Miss};

/// A blocking connection, driven through [`Io`].
#[derive(RefCast)]
#[repr(transparent)]
pub(crate) struct Blocking<C>(C);

impl<C> Blocking<C> {
    /// `conn` as a [`Blocking`] one.
    pub(crate) fn wrap(conn: &mut C) -> &mut Self {
        Self::ref_cast_mut(conn)
    }

    /// The connection itself.
    pub(crate) fn inner(&mut self) -> &mut C {
        &mut self.0
    }
}

impl<C> Io for Blocking<C>
where
    C: LoadConnection + Send,
    C::Backend: OccBackend,
{
    type Backend = C::Backend;

    fn in_transaction(&mut self) -> bool {
        in_transaction(&mut self.0)
    }

    fn refuse_broken(&mut self) -> Result<(), Error> {
        Ok(())
    }

    #[cfg(feature = "locks")]
    fn tighten_replies(&mut self, limit: Duration) -> Option<Tightened> {
        crate::connect::reply_bound::tighten(self.0.instrumentation(), limit)
    }

    fn classify(&mut self, error: DieselError) -> impl Future<Output = Error> + Send {
        ready(classify(&mut self.0, error))
    }

    fn pause(&mut self, pause: Duration) -> impl Future<Output = ()> + Send {
        std::thread::sleep(pause);
        ready(())
    }

    fn protect_caller<'a, 'c, T, F>(
        &'c mut self,
        own: bool,
        body: F,
    ) -> impl Future<Output = Result<T, Error>> + Send + 'c
    where
        for<'r> F: Body<&'r mut Self, QueryResult<T>, Fut: Send> + Send + 'a,
        T: Send + 'a,
        'a: 'c,
    {
        let sent = protect_caller(&mut self.0, own, |conn| now(body(Blocking::wrap(conn))));
        ready(sent.map_err(|e| classify(&mut self.0, e)))
    }

    fn call<'a, 'c, T, F>(&'c mut self, body: F) -> impl Future<Output = T> + Send + 'c
    where
        for<'r> F: Body<&'r mut Self, T, Fut: Send> + Send + 'a,
        T: Send + 'a,
        'a: 'c,
    {
        ready(now(body(self)))
    }
}

impl<C> Transactions for Blocking<C>
where
    C: LoadConnection + WriteTransaction + Send,
    C::Backend: OccBackend,
{
    fn own_transaction<'a, 'c, T, E, F>(
        &'c mut self,
        body: F,
    ) -> impl Future<Output = Result<T, E>> + Send + 'c
    where
        for<'r> F: Body<&'r mut Self, Result<T, E>, Fut: Send> + Send + 'a,
        T: Send + 'a,
        E: From<Error> + From<DieselError> + LostCommit + Send + 'a,
        'a: 'c,
    {
        ready(commit_operation(&mut self.0, |conn| {
            now(body(Blocking::wrap(conn)))
        }))
    }
}

impl<T, C> ReadOn<Blocking<C>> for T
where
    T: LoadByKey<C>,
    C: LoadConnection + Send,
    C::Backend: OccBackend,
{
    fn table_name() -> &'static str {
        <T as LoadByKey<C>>::table_name()
    }

    fn load_by_key(
        conn: &mut Blocking<C>,
        key: &T::Key,
    ) -> impl Future<Output = QueryResult<Option<T>>> + Send {
        ready(<T as LoadByKey<C>>::load_by_key(&mut conn.0, key))
    }

    fn load_by_keys(
        conn: &mut Blocking<C>,
        keys: &[T::Key],
    ) -> impl Future<Output = QueryResult<Vec<T>>> + Send {
        ready(<T as LoadByKey<C>>::load_by_keys(&mut conn.0, keys))
    }

    fn check_stored_precision(
        conn: &mut Blocking<C>,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        ready(check_stored_precision::<T, C>(&mut conn.0))
    }
}

impl<Q, C, U> QueryOn<Blocking<C>, U> for Q
where
    Q: RunQueryDsl<C> + LoadQuery<'static, C, U>,
    C: Connection,
    U: Send,
{
    fn load_on(self, conn: &mut Blocking<C>) -> impl Future<Output = QueryResult<Vec<U>>> + Send {
        ready(self.load(&mut conn.0))
    }
}

impl<S, C> ExecuteOn<Blocking<C>> for S
where
    S: ExecuteDsl<C>,
    C: Connection,
{
    fn execute_on(self, conn: &mut Blocking<C>) -> impl Future<Output = QueryResult<usize>> + Send {
        ready(ExecuteDsl::execute(self, &mut conn.0))
    }
}

impl<K, C, S, M, Tok> RunOn<Blocking<C>, S, M, Tok> for K
where
    C: LoadConnection + Send,
    C::Backend: OccBackend,
    S: Assignments<C::Backend>,
    K: Complete<C, S, Tok>,
    M: Miss<C>,
    Tok: Send,
{
    fn run(
        conn: &mut Blocking<C>,
        write: CompareAndSet<'_, S, M>,
        own: bool,
    ) -> impl Future<Output = Result<Written<Tok>, Error>> + Send {
        ready(write.run::<C, K, Tok>(&mut conn.0, own))
    }
}

impl<C> WriteAttempt for Blocking<C>
where
    C: LoadConnection + WriteTransaction,
    C::Backend: OccBackend,
{
    type Backend = C::Backend;

    fn caller_transaction(&mut self) -> Result<bool, Error> {
        Ok(in_transaction(&mut self.0))
    }

    /// diesel's transaction, as [`WriteTransaction`] begins and ends it on each backend.
    fn write_transaction<T, F>(&mut self, body: F) -> impl Future<Output = Ended<T>>
    where
        for<'r> F: Body<&'r mut Self, (End, T)>,
    {
        let mut ended = None;
        let transaction = self.0.write_transaction(|conn| {
            let (end, value) = now(body(Blocking::wrap(conn)));
            ended = Some((end, value));
            match end {
                End::Commit => Ok(()),
                End::Rollback => Err(DieselError::RollbackTransaction),
            }
        });
        ready(match (ended, transaction) {
            (Some((End::Commit, value)), committed) => Ended::Committed(value, committed),
            (Some((End::Rollback, value)), Err(DieselError::RollbackTransaction)) => {
                Ended::RolledBack(value, Ok(()))
            }
            (Some((End::Rollback, value)), rolled_back) => Ended::RolledBack(value, rolled_back),
            (None, Err(e)) => Ended::NotBegun(classify(&mut self.0, e)),
            (None, Ok(())) => unreachable!("a transaction that began runs its body"),
        })
    }

    fn discard(&mut self) {
        use diesel::connection::TransactionManager;
        C::TransactionManager::transaction_manager_status_mut(&mut self.0).set_in_error();
    }

    fn classifier(&mut self, error: Option<&DieselError>) -> impl Future<Output = Classifier> {
        ready(Classifier {
            in_transaction: in_transaction(&mut self.0),
            reason: error.and_then(|e| C::Backend::retry_reason(&mut self.0, e)),
        })
    }
}

impl<T, C> ReadRow<Blocking<C>> for T
where
    T: LoadByKey<C>,
{
    fn table_name() -> &'static str {
        <T as LoadByKey<C>>::table_name()
    }

    fn read_row(
        conn: &mut Blocking<C>,
        key: &T::Key,
        lock: RowLock,
    ) -> impl Future<Output = QueryResult<Option<T>>> {
        ready(match lock {
            RowLock::None => T::read_by_key(&mut conn.0, key),
            lock => T::lock_by_key(&mut conn.0, key, lock),
        })
    }
}

/// The attempts of a blocking call: on the caller's connection, or one checked out of a
/// pool for each ([`Connections`]); the pauses between them sleep the thread.
pub(crate) struct Sourced<S>(pub(crate) S);

impl<S> Attempts<Blocking<S::Connection>> for Sourced<S>
where
    S: Connections,
    S::Connection: LoadConnection + WriteTransaction,
    <S::Connection as Connection>::Backend: OccBackend,
{
    const FRESH_PER_ATTEMPT: bool = S::FRESH_PER_ATTEMPT;

    fn caller_transaction(&mut self) -> Result<bool, Error> {
        self.0.with(in_transaction)
    }

    fn attempt<T, F>(&mut self, body: F) -> impl Future<Output = Result<T, Error>>
    where
        for<'r> F: Body<&'r mut Blocking<S::Connection>, T>,
    {
        let mut ran = None;
        let checkout = self
            .0
            .with(|conn| ran = Some(now(body(Blocking::wrap(conn)))));
        ready(match (ran, checkout) {
            // The attempt ran: its outcome stands, whatever the source said after.
            (Some(ran), _) => Ok(ran),
            (None, Err(error)) => Err(error),
            (None, Ok(())) => unreachable!("a source that succeeds runs the attempt"),
        })
    }

    fn pause(&mut self, pause: Duration) -> impl Future<Output = ()> {
        std::thread::sleep(pause);
        ready(())
    }
}

impl<K, C, S, Tok> RunEachOn<Blocking<C>, S, Tok> for K
where
    K: CompleteEach<C, S, Tok>,
    Tok: Send,
{
    fn run_each(
        conn: &mut Blocking<C>,
        statements: Vec<S>,
    ) -> impl Future<Output = QueryResult<Vec<(usize, Option<Tok>)>>> + Send {
        ready(K::run_each(&mut conn.0, statements))
    }
}
