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

use diesel::expression::{AppearsOnTable, Expression};
use diesel::sql_types::{BoolOrNullableBool, Integer, Nullable, Text};
use diesel::{Column, Selectable};
use diesel_async::AsyncConnection;

use super::run::AsyncRun;
use crate::connect::backend::OccBackend;
use crate::drive::on_async::connection::{classify, NativeAsyncConnection};
use crate::drive::on_async::executor::AsyncMiss;
use crate::drive::on_async::send::AsyncLoadByKey;
use crate::drive::{ExecuteOn, Io, QueryOn, ReadOn, RunOn, Transactions};
use crate::error::Error;
use crate::flow::claim_lost::{ClaimIgnored, ClaimLost};
use crate::flow::finish_claims::report::FinishedClaims;
use crate::guard::status::HasStatus;
use crate::guard::{AdvanceInSql, Guarded};
use crate::operation::Operation;
use crate::sql::new_token::Counted;
use crate::sql::statement::Assignments;
use crate::status::claim::{claim, end_claim};
use crate::status::claim::{ClaimQueryOf, ClaimRequest, ClaimUpdateOf, FinishOf, OwnersOf};
use crate::status::claim_attempts::claim_counted;
use crate::status::claim_attempts::{
    AttemptLimit, Claimed, CountedClaimOf, CountedClaimQueryOf, ParkOf,
};
use crate::status::claim_filter::{ClaimCondition, ClaimFilter};
use crate::status::claim_heartbeat::{extend_claim, HeartbeatOf};
use crate::status::claim_in_one::{ClaimInOneOf, ClaimInOneUpdateOf};
use crate::status::claim_op::{Claim, ClaimHeartbeat, CountedClaim, EndClaim, EndClaims};
use crate::status::finish_claims::end_claims;
use crate::status::finish_claims::{FinishManyOf, FinishManyReturningOf};

/// [`retried`](crate::status::claim_retry::retried) on diesel-async connection `$conn`
/// for the future `$attempt` makes (made again for each attempt), its waits on tokio's
/// timer.
macro_rules! retried_async {
    ($conn:expr, $attempt:expr) => {{
        let mut run = $crate::flow::claim_policy::claim_run(
            $crate::drive::on_async::connection::in_transaction($conn),
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
        async move { retried_async!(conn, Claim::new(request, None).run_async(conn)) }
    }

    /// [`claim`](Self::claim) of the waiting rows that also match `condition`; see
    /// [`GuardedClaim::claim_where`](crate::GuardedClaim::claim_where).
    fn claim_where<'a, C, OwnerCol, AtCol, G>(
        conn: &'a mut C,
        owner: OwnerCol,
        claimed_at: AtCol,
        request: &'a ClaimRequest<'a, Self::Status>,
        condition: G,
    ) -> impl Future<Output = Result<Vec<Self>, Error>> + Send + 'a
    where
        Claim<Self, OwnerCol, AtCol>: AsyncRun<C>,
        C: AsyncConnection,
        G: ClaimCondition + AppearsOnTable<Self::Table> + Expression,
        G::SqlType: BoolOrNullableBool,
    {
        let _ = (owner, claimed_at);
        let filter = ClaimFilter::of(condition);
        async move {
            retried_async!(
                conn,
                Claim::new(request, Some(filter.clone())).run_async(conn)
            )
        }
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
        async move {
            retried_async!(
                conn,
                CountedClaim::new(request, limit, None).run_async(conn)
            )
        }
    }

    /// [`claim_counted`](Self::claim_counted) of the waiting rows that also match
    /// `condition`; see
    /// [`GuardedClaim::claim_counted_where`](crate::GuardedClaim::claim_counted_where).
    #[allow(clippy::too_many_arguments)] // The columns are named as the other claims name them.
    fn claim_counted_where<'a, C, OwnerCol, AtCol, AttemptsCol, G>(
        conn: &'a mut C,
        owner: OwnerCol,
        claimed_at: AtCol,
        attempts: AttemptsCol,
        request: &'a ClaimRequest<'a, Self::Status>,
        limit: &'a AttemptLimit<Self::Status>,
        condition: G,
    ) -> impl Future<Output = Result<Claimed<Self>, Error>> + Send + 'a
    where
        CountedClaim<Self, OwnerCol, AtCol, AttemptsCol>: AsyncRun<C>,
        C: AsyncConnection,
        G: ClaimCondition + AppearsOnTable<Self::Table> + Expression,
        G::SqlType: BoolOrNullableBool,
    {
        let _ = (owner, claimed_at, attempts);
        let filter = ClaimFilter::of(condition);
        async move {
            retried_async!(
                conn,
                CountedClaim::new(request, limit, Some(filter.clone())).run_async(conn)
            )
        }
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
    T: HasStatus + Clone + ReadOn<C> + Selectable<<C as Io>::Backend>,
    T::Guard: AdvanceInSql,
    C: Transactions + NativeAsyncConnection,
    OwnerCol: Column<Table = T::Table, SqlType = Nullable<Text>> + 'static,
    AtCol: Column<Table = T::Table> + 'static,
    ClaimQueryOf<T, AtCol, <C as Io>::Backend>: QueryOn<C, T> + Send,
    for<'k> Counted: RunOn<C, ClaimUpdateOf<T, OwnerCol, AtCol>, ClaimIgnored<'k, T>, ()>,
    ClaimInOneOf<T, OwnerCol, AtCol, <C as Io>::Backend>: QueryOn<C, T> + Send,
    ClaimInOneUpdateOf<T, OwnerCol, AtCol>: Assignments<<C as Io>::Backend>,
    OwnerCol: Default,
    T::Table: diesel::query_dsl::methods::FilterDsl<T::KeysPredicate>,
    diesel::dsl::Filter<T::Table, T::KeysPredicate>:
        diesel::query_dsl::methods::SelectDsl<OwnerCol>,
    OwnersOf<T, OwnerCol>: QueryOn<C, Option<String>> + Send,
{
    async fn run_async(
        self,
        conn: &mut C,
    ) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        claim::<T, C, OwnerCol, AtCol>(conn, &self.request(), self.filter()).await
    }
}

impl<T, C, OwnerCol, AtCol, AttemptsCol> AsyncRun<C>
    for CountedClaim<T, OwnerCol, AtCol, AttemptsCol>
where
    T: HasStatus + Clone + ReadOn<C> + Selectable<<C as Io>::Backend>,
    T::Guard: AdvanceInSql,
    C: Transactions + NativeAsyncConnection,
    OwnerCol: Column<Table = T::Table, SqlType = Nullable<Text>> + 'static,
    AtCol: Column<Table = T::Table> + 'static,
    AttemptsCol: Column<Table = T::Table, SqlType = Integer> + Default + 'static,
    CountedClaimQueryOf<T, AtCol, AttemptsCol, <C as Io>::Backend>: QueryOn<C, (T, i32)>,
    OwnerCol: Default,
    T::Table: diesel::query_dsl::methods::FilterDsl<T::KeysPredicate>,
    diesel::dsl::Filter<T::Table, T::KeysPredicate>:
        diesel::query_dsl::methods::SelectDsl<OwnerCol>,
    OwnersOf<T, OwnerCol>: QueryOn<C, Option<String>> + Send,
    for<'k> Counted: RunOn<C, CountedClaimOf<T, OwnerCol, AtCol, AttemptsCol>, ClaimIgnored<'k, T>, ()>
        + RunOn<C, ParkOf<T, OwnerCol>, ClaimIgnored<'k, T>, ()>,
{
    async fn run_async(
        self,
        conn: &mut C,
    ) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        let request = self.request();
        claim_counted::<T, C, OwnerCol, AtCol, AttemptsCol>(
            conn,
            &request,
            &self.limit,
            self.filter(),
        )
        .await
    }
}

impl<T, C, OwnerCol, AtCol> AsyncRun<C> for ClaimHeartbeat<T, OwnerCol, AtCol>
where
    T: HasStatus + ReadOn<C>,
    T::Guard: AdvanceInSql,
    C: Transactions + NativeAsyncConnection,
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
    T: HasStatus + ReadOn<C>,
    T::Guard: AdvanceInSql,
    C: Io + NativeAsyncConnection,
    OwnerCol: Column<Table = T::Table, SqlType = Nullable<Text>> + 'static,
    for<'k> Counted: RunOn<C, FinishOf<T, OwnerCol>, ClaimLost<'k, T>, ()>,
{
    async fn run_async(
        self,
        conn: &mut C,
    ) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        let ending = self.ending.as_ending();
        end_claim::<T, C, OwnerCol>(conn, &self.key, ending).await
    }
}

impl<T, C, OwnerCol> AsyncRun<C> for EndClaims<T, OwnerCol>
where
    T: HasStatus + Clone + ReadOn<C>,
    T::Guard: AdvanceInSql,
    C: Transactions + NativeAsyncConnection,
    OwnerCol: Column<Table = T::Table, SqlType = Nullable<Text>> + 'static,
    FinishManyOf<T, OwnerCol>: Assignments<<C as Io>::Backend> + ExecuteOn<C> + Send,
    FinishManyReturningOf<T, OwnerCol>: QueryOn<C, T::Key> + Send,
    for<'k> Counted: RunOn<C, FinishOf<T, OwnerCol>, ClaimLost<'k, T>, ()>,
{
    async fn run_async(
        self,
        conn: &mut C,
    ) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        let ending = self.ending.as_ending();
        end_claims::<T, C, OwnerCol>(conn, &self.keys, ending).await
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
