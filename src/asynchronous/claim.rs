//! Task claiming on diesel-async connections: the blocking
//! [`GuardedClaim`](crate::GuardedClaim) as futures, with the same statements (the
//! one-statement claim on PostgreSQL, the locked read that skips other workers' rows and
//! the hand-over on MySQL, the park, the heartbeat and the owner-checked ends) and the same
//! explanation of a claim that went astray.
//!
//! A claim on MySQL, a counted claim and a heartbeat are each one transaction of the
//! library's: a future dropped inside it leaves the connection broken, to be closed when
//! it goes back to its pool (the transaction ends with it, unapplied). A claim on
//! PostgreSQL is one statement: dropped after it was sent, it may still be applied, and
//! its rows stay claimed under the worker's owner id until `reclaim_after` has passed
//! (for good without one), as a crashed worker's do.

use std::future::Future;

use diesel::query_builder::QueryId;
use diesel::sql_types::{Integer, Nullable, Text};
use diesel::{Column, Selectable};
use diesel_async::methods::{ExecuteDsl, LoadQuery};
use diesel_async::{AsyncConnection, RunQueryDsl};

use super::connection::{
    classified, classify, in_transaction, refuse_broken, NativeAsync, NativeAsyncConnection,
};
use super::entity::check_stored_precision;
use super::executor::{protect_caller, run, AsyncMiss};
use super::run::AsyncRun;
use super::send::{AsyncComplete, AsyncLoadByKey};
use super::transaction::{Call, OwnTransaction};
use crate::connect::backend::OccBackend;
use crate::drive::{Io, QueryOn, ReadOn, RunOn};
use crate::error::Error;
use crate::flow::claim_lost::{ClaimIgnored, ClaimLost};
use crate::flow::compare_and_set::{refuse_double_assignment, CompareAndSet};
use crate::flow::finish_claims::report::FinishedClaims;
use crate::flow::finish_claims::{Effect, FinishClaims as Flow};
use crate::guard::status::HasStatus;
use crate::guard::{AdvanceInSql, Guarded};
use crate::operation::Operation;
use crate::sql::new_token::Counted;
use crate::sql::statement::Assignments;
use crate::sql::statement::Returning;
use crate::status::claim::write_locked;
use crate::status::claim::{
    check_owners, claim_query, claim_update, finish_statement, ClaimQueryOf, ClaimRequest,
    ClaimUpdateOf, FinishOf,
};
use crate::status::claim_attempts::claim_counted;
use crate::status::claim_attempts::{
    AttemptLimit, Claimed, CountedClaimOf, CountedClaimQueryOf, ParkOf,
};
use crate::status::claim_heartbeat::{extend_claim, HeartbeatOf};
use crate::status::claim_in_one::{claim_in_one, ClaimInOneOf, ClaimInOneUpdateOf};
use crate::status::claim_op::{Claim, ClaimHeartbeat, CountedClaim, EndClaim, EndClaims, Ending};
use crate::status::finish_claims::{finish_many_statement, FinishManyOf, FinishManyReturningOf};

/// [`retried`](crate::status::claim_retry::retried) on diesel-async connection `$conn`
/// for the future `$attempt` makes (made again for each attempt), its waits on tokio's
/// timer.
macro_rules! retried_async {
    ($conn:expr, $attempt:expr) => {{
        let mut run = $crate::flow::claim_policy::claim_run(
            $crate::asynchronous::connection::in_transaction($conn),
        );
        loop {
            match $attempt.await {
                Ok(value) => break Ok(value),
                Err(error) => match run.wait_after::<$crate::Error>($crate::Stop::Occ(error)) {
                    Ok(pause) => tokio::time::sleep(pause).await,
                    Err(error) => break Err(error),
                },
            }
        }
    }};
}

/// Task claiming on async connections, for entities with a status column, an owner column
/// and a claim-time column whose guard advances in SQL; see
/// [`GuardedClaim`](crate::GuardedClaim) for what each call does and answers.
pub trait AsyncGuardedClaim: HasStatus + Clone
where
    Self::Guard: AdvanceInSql,
{
    /// Claims up to `request.limit` waiting (or abandoned) rows for `request.owner`; see
    /// [`GuardedClaim::claim`](crate::GuardedClaim::claim).
    fn claim<'a, C, OwnerCol, AtCol>(
        conn: &'a mut C,
        owner: OwnerCol,
        claimed_at: AtCol,
        request: &'a ClaimRequest<'a, Self::Status>,
    ) -> impl Future<Output = Result<Vec<Self>, Error>> + Send + 'a
    where
        Claim<Self, OwnerCol, AtCol>: AsyncRun<C>,
        C: AsyncConnection,
    {
        let _ = (owner, claimed_at);
        async move { retried_async!(conn, Claim::new(request).run_async(conn)) }
    }

    /// [`claim`](Self::claim), counting attempts and parking rows that used them up; see
    /// [`GuardedClaim::claim_counted`](crate::GuardedClaim::claim_counted).
    fn claim_counted<'a, C, OwnerCol, AtCol, AttemptsCol>(
        conn: &'a mut C,
        owner: OwnerCol,
        claimed_at: AtCol,
        attempts: AttemptsCol,
        request: &'a ClaimRequest<'a, Self::Status>,
        limit: &'a AttemptLimit<Self::Status>,
    ) -> impl Future<Output = Result<Claimed<Self>, Error>> + Send + 'a
    where
        CountedClaim<Self, OwnerCol, AtCol, AttemptsCol>: AsyncRun<C>,
        C: AsyncConnection,
    {
        let _ = (owner, claimed_at, attempts);
        async move { retried_async!(conn, CountedClaim::new(request, limit).run_async(conn)) }
    }

    /// The heartbeat of a claim `owner` still holds; see
    /// [`GuardedClaim::extend_claim`](crate::GuardedClaim::extend_claim).
    fn extend_claim<'a, C, OwnerCol, AtCol>(
        conn: &'a mut C,
        key: &'a Self::Key,
        owner_column: OwnerCol,
        claimed_at: AtCol,
        owner: &'a str,
        held: Self::Status,
    ) -> impl Future<Output = Result<Self, Error>> + Send + 'a
    where
        ClaimHeartbeat<Self, OwnerCol, AtCol>: AsyncRun<C>,
        C: AsyncConnection,
    {
        let _ = (owner_column, claimed_at);
        async move { retried_async!(conn, ClaimHeartbeat::new(key, owner, held).run_async(conn)) }
    }

    /// Ends the claim `owner` holds, owner-checked; see
    /// [`GuardedClaim::finish_claim`](crate::GuardedClaim::finish_claim).
    #[allow(clippy::too_many_arguments)]
    fn finish_claim<'a, C, OwnerCol>(
        conn: &'a mut C,
        key: &'a Self::Key,
        owner_column: OwnerCol,
        owner: &'a str,
        held: Self::Status,
        to: Self::Status,
        next_owner: Option<&'a str>,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'a
    where
        EndClaim<Self, OwnerCol>: AsyncRun<C>,
        C: AsyncConnection,
    {
        let _ = owner_column;
        async move {
            retried_async!(
                conn,
                EndClaim::new(key, owner, held, to, next_owner).run_async(conn)
            )
        }
    }

    /// Ends `owner`'s claims on the rows of many `keys` at once; see
    /// [`GuardedClaim::finish_claims`](crate::GuardedClaim::finish_claims).
    #[allow(clippy::too_many_arguments)]
    fn finish_claims<C, OwnerCol>(
        conn: &mut C,
        keys: &[Self::Key],
        owner_column: OwnerCol,
        owner: &str,
        held: Self::Status,
        to: Self::Status,
        next_owner: Option<&str>,
    ) -> impl Future<Output = Result<FinishedClaims<Self::Key>, Error>> + Send
    where
        EndClaims<Self, OwnerCol>: AsyncRun<C>,
    {
        let _ = owner_column;
        EndClaims::new(keys, owner, held, to, next_owner).run_async(conn)
    }
}

impl<T> AsyncGuardedClaim for T
where
    T: HasStatus + Clone,
    T::Guard: AdvanceInSql,
{
}

impl<T, C, OwnerCol, AtCol> AsyncRun<C> for Claim<T, OwnerCol, AtCol>
where
    T: HasStatus + Clone + Sync + AsyncLoadByKey<C> + Selectable<C::Backend>,
    T::Guard: AdvanceInSql,
    C: NativeAsyncConnection,
    C::Backend: NativeAsync,
    OwnerCol: Column<Table = T::Table, SqlType = Nullable<Text>> + 'static,
    AtCol: Column<Table = T::Table> + 'static,
    T::SelectExpression: QueryId,
    ClaimQueryOf<T, AtCol, C::Backend>: LoadQuery<'static, C, T> + Send + 'static,
    ClaimUpdateOf<T, OwnerCol, AtCol>: Assignments<C::Backend> + Send,
    Counted: AsyncComplete<C, ClaimUpdateOf<T, OwnerCol, AtCol>, ()>,
    ClaimInOneOf<T, OwnerCol, AtCol, C::Backend>: LoadQuery<'static, C, T> + Send + 'static,
    ClaimInOneUpdateOf<T, OwnerCol, AtCol>: Assignments<C::Backend>,
{
    async fn run_async(
        self,
        conn: &mut C,
    ) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        let request = &self.request();
        crate::sql::names::check_name("owner", request.owner)?;
        if request.limit == 0 {
            return Ok(Vec::new());
        }
        refuse_broken(conn)?;
        if C::Backend::RETURNING {
            let table = <T as AsyncLoadByKey<C>>::table_name();
            check_stored_precision::<T, C>(conn, table).await?;
            let claim = claim_in_one::<T, OwnerCol, AtCol, C::Backend>(table, request)?;
            let loaded = protect_caller(conn, false, async |conn| claim.load(conn).await).await?;
            return classified(conn, loaded).await;
        }
        let mut transaction = OwnTransaction::begin(conn).await?;
        let claimed = async {
            let conn = transaction.conn();
            let query = claim_query::<T, AtCol, C::Backend>(request);
            let waiting: Vec<T> = match query.load(conn).await {
                Ok(rows) => rows,
                Err(e) => return Err(classify(conn, e).await),
            };
            write_locked(conn, &waiting, |keys| {
                claim_update::<T, OwnerCol, AtCol, _>(request, keys)
            })
            .await
        }
        .await;
        transaction.settle(claimed).await
    }
}

impl<T, C, OwnerCol, AtCol, AttemptsCol> AsyncRun<C>
    for CountedClaim<T, OwnerCol, AtCol, AttemptsCol>
where
    T: HasStatus + Clone + ReadOn<C> + Selectable<<C as Io>::Backend>,
    T::Guard: AdvanceInSql,
    C: Io + NativeAsyncConnection,
    OwnerCol: Column<Table = T::Table, SqlType = Nullable<Text>> + 'static,
    AtCol: Column<Table = T::Table> + 'static,
    AttemptsCol: Column<Table = T::Table, SqlType = Integer> + Default + 'static,
    CountedClaimQueryOf<T, AtCol, AttemptsCol, <C as Io>::Backend>: QueryOn<C, (T, i32)>,
    for<'k> Counted: RunOn<C, CountedClaimOf<T, OwnerCol, AtCol, AttemptsCol>, ClaimIgnored<'k, T>, ()>
        + RunOn<C, ParkOf<T, OwnerCol>, ClaimIgnored<'k, T>, ()>,
{
    async fn run_async(
        self,
        conn: &mut C,
    ) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        let request = self.request();
        claim_counted::<T, C, OwnerCol, AtCol, AttemptsCol>(conn, &request, &self.limit).await
    }
}

impl<T, C, OwnerCol, AtCol> AsyncRun<C> for ClaimHeartbeat<T, OwnerCol, AtCol>
where
    T: HasStatus + ReadOn<C>,
    T::Guard: AdvanceInSql,
    C: Io + NativeAsyncConnection,
    OwnerCol: Column<Table = T::Table, SqlType = Nullable<Text>> + 'static,
    AtCol: Column<Table = T::Table> + 'static,
    for<'k> Counted: RunOn<C, HeartbeatOf<T, OwnerCol, AtCol>, ClaimLost<'k, T>, ()>,
{
    async fn run_async(
        self,
        conn: &mut C,
    ) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        extend_claim::<T, C, OwnerCol, AtCol>(conn, &self.key, &self.owner, self.held).await
    }
}

impl<T, C, OwnerCol> AsyncRun<C> for EndClaim<T, OwnerCol>
where
    T: HasStatus + AsyncLoadByKey<C>,
    T::Guard: AdvanceInSql,
    C: NativeAsyncConnection,
    C::Backend: NativeAsync,
    OwnerCol: Column<Table = T::Table, SqlType = Nullable<Text>> + 'static,
    FinishOf<T, OwnerCol>: Assignments<C::Backend> + Send,
    Counted: AsyncComplete<C, FinishOf<T, OwnerCol>, ()>,
{
    async fn run_async(
        self,
        conn: &mut C,
    ) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        let key = &self.key;
        let Ending {
            owner,
            held,
            to,
            next_owner,
        } = &self.ending;
        let (owner, held, to, next_owner) = (owner.as_str(), *held, *to, next_owner.as_deref());
        check_owners(owner, next_owner)?;
        refuse_broken(conn)?;
        let table = <T as AsyncLoadByKey<C>>::table_name();
        let mut call = Call::start(conn);
        let finished = async {
            let conn = call.conn();
            check_stored_precision::<T, C>(conn, table).await?;
            let statement = finish_statement::<T, OwnerCol>(key, owner, held, to, next_owner);
            let miss = ClaimLost::<T> { key, owner, held };
            let write = CompareAndSet::one(statement, table, key, miss);
            run::<C, _, _, Counted, ()>(write, conn, false)
                .await
                .map(drop)
        }
        .await;
        call.finish(finished)
    }
}

impl<T, C, OwnerCol> AsyncRun<C> for EndClaims<T, OwnerCol>
where
    T: HasStatus + Clone + Sync + AsyncLoadByKey<C>,
    EndClaim<T, OwnerCol>: AsyncRun<C>,
    T: Selectable<C::Backend>,
    T::Guard: AdvanceInSql,
    C: NativeAsyncConnection,
    C::Backend: NativeAsync,
    OwnerCol: Column<Table = T::Table, SqlType = Nullable<Text>> + 'static,
    FinishManyOf<T, OwnerCol>: Assignments<C::Backend> + ExecuteDsl<C> + Send + 'static,
    FinishManyReturningOf<T, OwnerCol>: LoadQuery<'static, C, T::Key> + Send + 'static,
{
    async fn run_async(
        self,
        conn: &mut C,
    ) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        let keys = self.keys.as_slice();
        let Ending {
            owner,
            held,
            to,
            next_owner,
        } = &self.ending;
        let (owner, held, to, next_owner) = (owner.as_str(), *held, *to, next_owner.as_deref());
        check_owners(owner, next_owner)?;
        let statement = |keys: &[T::Key]| {
            finish_many_statement::<T, OwnerCol>(keys, owner, held, to, next_owner)
        };
        let table = <T as AsyncLoadByKey<C>>::table_name();
        let in_callers = in_transaction(conn);
        let returning = C::Backend::RETURNING;
        let mut flow = Flow::<T>::new(keys, table, (owner, held), returning, in_callers);
        let mut effect = flow.start();
        loop {
            effect = match effect {
                Effect::Check(key) => {
                    refuse_broken(conn)?;
                    // In a call: a read dropped half way on MySQL leaves its reply on the
                    // socket.
                    let mut call = Call::start(&mut *conn);
                    let checked = check_stored_precision::<T, C>(call.conn(), table).await;
                    flow.checked(
                        call.finish(checked)
                            .and_then(|()| refuse_double_assignment(table, &statement(&[key]))),
                    )
                }
                Effect::SendReturning(chunk) => {
                    let key_columns = diesel::Table::primary_key(&T::table());
                    let returning = Returning::new(statement(&chunk), key_columns);
                    let sent = protect_caller(conn, false, async |conn| returning.load(conn).await);
                    let sent = sent.await;
                    flow.returned(match sent {
                        Ok(sent) => classified(conn, sent).await,
                        Err(e) => Err(e),
                    })
                }
                Effect::LookUp(key) => {
                    let row = T::load_by_key(conn, &key).await;
                    flow.looked_up(classified(conn, row).await)
                }
                Effect::SendAllOrNothing(chunk) => {
                    let keys = chunk.len();
                    flow.all_or_nothing(every_claim_ended(conn, statement(&chunk), keys).await)
                }
                Effect::EndAlone(key) => {
                    let ended = EndClaim::<T, OwnerCol>::new(&key, owner, held, to, next_owner);
                    flow.ended_alone(ended.run_async(conn).await)
                }
                Effect::Pause(pause) => {
                    tokio::time::sleep(pause).await;
                    flow.paused()
                }
                Effect::Done => return flow.outcome(),
            }
        }
    }
}

/// Sends `statement` in a transaction and commits it when it matched all `keys` rows;
/// otherwise rolls it back (`false`); see the blocking path's.
async fn every_claim_ended<C, S>(conn: &mut C, statement: S, keys: usize) -> Result<bool, Error>
where
    C: NativeAsyncConnection,
    C::Backend: NativeAsync,
    S: ExecuteDsl<C> + Send,
{
    let mut transaction = OwnTransaction::begin(conn).await?;
    let matched = {
        let conn = transaction.conn();
        match ExecuteDsl::execute(statement, conn).await {
            Ok(matched) => Ok(matched),
            Err(e) => Err(classify(conn, e).await),
        }
    };
    match matched {
        Ok(matched) if matched == keys => transaction.settle(Ok(true)).await,
        Ok(_) => {
            transaction.rollback().await.map_err(Error::Database)?;
            Ok(false)
        }
        Err(e) => transaction.settle(Err(e)).await,
    }
}

impl<T, C> AsyncMiss<C> for ClaimIgnored<'_, T>
where
    T: AsyncLoadByKey<C> + Sync,
    T::Guard: AdvanceInSql,
    C: AsyncConnection,
    C::Backend: OccBackend,
{
    async fn explain(self, conn: &mut C) -> Error {
        let keys: Vec<T::Key> = self.locked.iter().map(Guarded::key).collect();
        match T::load_by_keys(conn, &keys).await {
            Ok(current) => self.given(current),
            Err(e) => classify(conn, e).await,
        }
    }
}

impl<T, C> AsyncMiss<C> for ClaimLost<'_, T>
where
    T: HasStatus + AsyncLoadByKey<C>,
    T::Guard: AdvanceInSql,
    C: AsyncConnection,
    C::Backend: OccBackend,
{
    async fn explain(self, conn: &mut C) -> Error {
        match T::load_by_key(conn, self.key).await {
            Ok(row) => self.given(<T as AsyncLoadByKey<C>>::table_name(), row),
            Err(e) => classify(conn, e).await,
        }
    }
}
