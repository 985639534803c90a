//! One claim test body, two executors: the blocking [`GuardedClaim`] on a connection of
//! the test's r2d2 pool, and [`AsyncGuardedClaim`] on a diesel-async connection to the same
//! database, driven from the calling thread. Test bodies take a [`ClaimWorker`] (or a
//! function making one per thread) and run unchanged on both; the `jobs` table and its
//! [`Job`] are shared by the claim tests.

use std::time::Duration;

use chrono::NaiveDateTime;
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_occ::asynchronous::{AsyncGuardedClaim, AsyncRun};
use diesel_occ::op;
use diesel_occ::{
    AdvanceInSql, AttemptLimit, ClaimCounted, ClaimOrder, ClaimRequest, ClaimRows, Claimed, Error,
    ExtendClaim, FinishClaim, FinishClaims, FinishedClaims, GuardedClaim, HasStatus, Status,
};

use std::sync::{Arc, Mutex};

use super::paths::{cache_recorder, recorder, Async, Blocking};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Status)]
pub enum JobState {
    #[occ(from(Running))]
    Open,
    #[occ(from(Open, Running))]
    Running,
    #[occ(from(Running))]
    Done,
    #[occ(from(Open, Running))]
    Parked,
}

diesel::table! {
    jobs (id) {
        id -> BigInt,
        state -> Text,
        owner -> Nullable<Text>,
        claimed_at -> Nullable<Timestamp>,
        attempts -> Integer,
        version -> BigInt,
    }
}

#[derive(
    Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Insertable, diesel_occ::Guarded,
)]
#[diesel(table_name = jobs)]
pub struct Job {
    pub id: i64,
    #[occ(status)]
    pub state: JobState,
    pub owner: Option<String>,
    pub claimed_at: Option<NaiveDateTime>,
    pub attempts: i32,
    #[occ(version)]
    pub version: i64,
}

/// Creates the empty `jobs` table on `conn`, of backend `backend`.
pub fn create_jobs(conn: &mut impl SimpleConnection, backend: &str) {
    let stamp = if backend == "mysql" {
        "DATETIME(6)"
    } else {
        "TIMESTAMP"
    };
    conn.batch_execute(&format!(
        "CREATE TABLE jobs (id BIGINT PRIMARY KEY, state VARCHAR(16) NOT NULL, owner VARCHAR(64), \
         claimed_at {stamp}, attempts INTEGER NOT NULL, version BIGINT NOT NULL)"
    ))
    .unwrap();
}

/// Adds an open job for each of `ids`.
pub fn add_jobs(conn: &mut impl SimpleConnection, ids: std::ops::RangeInclusive<i64>) {
    let rows: Vec<String> = ids
        .map(|id| format!("({id}, 'open', NULL, NULL, 0, 0)"))
        .collect();
    for chunk in rows.chunks(500) {
        conn.batch_execute(&format!(
            "INSERT INTO jobs (id, state, owner, claimed_at, attempts, version) VALUES {}",
            chunk.join(", ")
        ))
        .unwrap();
    }
}

/// A claim from `Open` to `Running` for `owner`, taking over claims older than
/// `reclaim_after`.
pub fn request(owner: &str, limit: usize, reclaim_after: Duration) -> ClaimRequest<'_, JobState> {
    ClaimRequest {
        from: JobState::Open,
        to: JobState::Running,
        owner,
        limit,
        reclaim_after: Some(reclaim_after),
        order: ClaimOrder::Any,
    }
}

/// The claim calls of the shared test bodies, on the `jobs` table.
pub trait ClaimWorker {
    /// Which executor, for messages.
    const PATH: &'static str;
    fn claim(&mut self, request: &ClaimRequest<'_, JobState>) -> Result<Vec<Job>, Error>;
    fn claim_counted(
        &mut self,
        request: &ClaimRequest<'_, JobState>,
        limit: &AttemptLimit<JobState>,
    ) -> Result<Claimed<Job>, Error>;
    /// A claim of the jobs with ids up to `max_id` only (`claim_where`).
    fn claim_ids_up_to(
        &mut self,
        request: &ClaimRequest<'_, JobState>,
        max_id: i64,
    ) -> Result<Vec<Job>, Error>;
    /// A counted claim of the jobs with ids up to `max_id` only (`claim_counted_where`).
    fn claim_counted_ids_up_to(
        &mut self,
        request: &ClaimRequest<'_, JobState>,
        limit: &AttemptLimit<JobState>,
        max_id: i64,
    ) -> Result<Claimed<Job>, Error>;
    fn extend_claim(&mut self, id: i64, owner: &str, held: JobState) -> Result<Job, Error>;
    fn finish_claim(
        &mut self,
        id: i64,
        owner: &str,
        held: JobState,
        to: JobState,
        next_owner: Option<&str>,
    ) -> Result<(), Error>;
    fn finish_claims(
        &mut self,
        ids: &[i64],
        owner: &str,
        held: JobState,
        to: JobState,
        next_owner: Option<&str>,
    ) -> Result<FinishedClaims<i64>, Error>;
    /// Records the text of every statement the worker's connection sends from now on.
    fn record_statements(&mut self) -> Arc<Mutex<Vec<String>>>;
    /// Records the text of every statement the worker's connection prepares and keeps
    /// in its cache from now on.
    fn record_cached(&mut self) -> Arc<Mutex<Vec<String>>>;
    /// Ends the worker's server session on `backend` from inside it (nothing on SQLite):
    /// its next statement finds the connection lost.
    fn end_session(&mut self, backend: &str);
}

/// The statement by which a session of `backend` ends itself.
pub fn ending_own_session(backend: &str) -> Option<&'static str> {
    match backend {
        "postgres" => Some("SELECT pg_terminate_backend(pg_backend_pid())"),
        "mysql" => Some("EXECUTE IMMEDIATE CONCAT('KILL ', CONNECTION_ID())"),
        _ => None,
    }
}

impl<C> ClaimWorker for Blocking<C>
where
    C: diesel::Connection,
    Job: ClaimRows<C, jobs::owner, jobs::claimed_at>
        + ClaimCounted<C, jobs::owner, jobs::claimed_at, jobs::attempts>
        + ExtendClaim<C, jobs::owner, jobs::claimed_at>
        + FinishClaim<C, jobs::owner>
        + FinishClaims<C, jobs::owner>,
{
    const PATH: &'static str = "blocking";
    fn claim(&mut self, request: &ClaimRequest<'_, JobState>) -> Result<Vec<Job>, Error> {
        <Job as GuardedClaim>::claim(&mut self.0, jobs::owner, jobs::claimed_at, request)
    }
    fn claim_counted(
        &mut self,
        request: &ClaimRequest<'_, JobState>,
        limit: &AttemptLimit<JobState>,
    ) -> Result<Claimed<Job>, Error> {
        <Job as GuardedClaim>::claim_counted(
            &mut self.0,
            jobs::owner,
            jobs::claimed_at,
            jobs::attempts,
            request,
            limit,
        )
    }
    fn claim_ids_up_to(
        &mut self,
        request: &ClaimRequest<'_, JobState>,
        max_id: i64,
    ) -> Result<Vec<Job>, Error> {
        <Job as GuardedClaim>::claim_where(
            &mut self.0,
            jobs::owner,
            jobs::claimed_at,
            request,
            jobs::id.le(max_id),
        )
    }
    fn claim_counted_ids_up_to(
        &mut self,
        request: &ClaimRequest<'_, JobState>,
        limit: &AttemptLimit<JobState>,
        max_id: i64,
    ) -> Result<Claimed<Job>, Error> {
        <Job as GuardedClaim>::claim_counted_where(
            &mut self.0,
            jobs::owner,
            jobs::claimed_at,
            jobs::attempts,
            request,
            limit,
            jobs::id.le(max_id),
        )
    }
    fn extend_claim(&mut self, id: i64, owner: &str, held: JobState) -> Result<Job, Error> {
        <Job as GuardedClaim>::extend_claim(
            &mut self.0,
            &id,
            jobs::owner,
            jobs::claimed_at,
            owner,
            held,
        )
    }
    fn finish_claim(
        &mut self,
        id: i64,
        owner: &str,
        held: JobState,
        to: JobState,
        next_owner: Option<&str>,
    ) -> Result<(), Error> {
        <Job as GuardedClaim>::finish_claim(
            &mut self.0,
            &id,
            jobs::owner,
            owner,
            held,
            to,
            next_owner,
        )
    }
    fn finish_claims(
        &mut self,
        ids: &[i64],
        owner: &str,
        held: JobState,
        to: JobState,
        next_owner: Option<&str>,
    ) -> Result<FinishedClaims<i64>, Error> {
        <Job as GuardedClaim>::finish_claims(
            &mut self.0,
            ids,
            jobs::owner,
            owner,
            held,
            to,
            next_owner,
        )
    }
    fn record_statements(&mut self) -> Arc<Mutex<Vec<String>>> {
        let statements = Arc::new(Mutex::new(Vec::new()));
        self.0.set_instrumentation(recorder(&statements));
        statements
    }
    fn record_cached(&mut self) -> Arc<Mutex<Vec<String>>> {
        let statements = Arc::new(Mutex::new(Vec::new()));
        self.0.set_instrumentation(cache_recorder(&statements));
        statements
    }
    fn end_session(&mut self, backend: &str) {
        if let Some(sql) = ending_own_session(backend) {
            // Answered with the end of the session itself, or not at all.
            let _ = self.0.batch_execute(sql);
        }
    }
}

impl<A> ClaimWorker for Async<A>
where
    A: diesel_async::AsyncConnection,
    op::Claim<Job, jobs::owner, jobs::claimed_at>: AsyncRun<A>,
    op::CountedClaim<Job, jobs::owner, jobs::claimed_at, jobs::attempts>: AsyncRun<A>,
    op::ClaimHeartbeat<Job, jobs::owner, jobs::claimed_at>: AsyncRun<A>,
    op::EndClaim<Job, jobs::owner>: AsyncRun<A>,
    op::EndClaims<Job, jobs::owner>: AsyncRun<A>,
{
    const PATH: &'static str = "async";
    fn claim(&mut self, request: &ClaimRequest<'_, JobState>) -> Result<Vec<Job>, Error> {
        self.runtime.block_on(<Job as AsyncGuardedClaim>::claim(
            &mut self.conn,
            jobs::owner,
            jobs::claimed_at,
            request,
        ))
    }
    fn claim_counted(
        &mut self,
        request: &ClaimRequest<'_, JobState>,
        limit: &AttemptLimit<JobState>,
    ) -> Result<Claimed<Job>, Error> {
        self.runtime
            .block_on(<Job as AsyncGuardedClaim>::claim_counted(
                &mut self.conn,
                jobs::owner,
                jobs::claimed_at,
                jobs::attempts,
                request,
                limit,
            ))
    }
    fn claim_ids_up_to(
        &mut self,
        request: &ClaimRequest<'_, JobState>,
        max_id: i64,
    ) -> Result<Vec<Job>, Error> {
        self.runtime
            .block_on(<Job as AsyncGuardedClaim>::claim_where(
                &mut self.conn,
                jobs::owner,
                jobs::claimed_at,
                request,
                jobs::id.le(max_id),
            ))
    }
    fn claim_counted_ids_up_to(
        &mut self,
        request: &ClaimRequest<'_, JobState>,
        limit: &AttemptLimit<JobState>,
        max_id: i64,
    ) -> Result<Claimed<Job>, Error> {
        self.runtime
            .block_on(<Job as AsyncGuardedClaim>::claim_counted_where(
                &mut self.conn,
                jobs::owner,
                jobs::claimed_at,
                jobs::attempts,
                request,
                limit,
                jobs::id.le(max_id),
            ))
    }
    fn extend_claim(&mut self, id: i64, owner: &str, held: JobState) -> Result<Job, Error> {
        self.runtime
            .block_on(<Job as AsyncGuardedClaim>::extend_claim(
                &mut self.conn,
                &id,
                jobs::owner,
                jobs::claimed_at,
                owner,
                held,
            ))
    }
    fn finish_claim(
        &mut self,
        id: i64,
        owner: &str,
        held: JobState,
        to: JobState,
        next_owner: Option<&str>,
    ) -> Result<(), Error> {
        self.runtime
            .block_on(<Job as AsyncGuardedClaim>::finish_claim(
                &mut self.conn,
                &id,
                jobs::owner,
                owner,
                held,
                to,
                next_owner,
            ))
    }
    fn finish_claims(
        &mut self,
        ids: &[i64],
        owner: &str,
        held: JobState,
        to: JobState,
        next_owner: Option<&str>,
    ) -> Result<FinishedClaims<i64>, Error> {
        self.runtime
            .block_on(<Job as AsyncGuardedClaim>::finish_claims(
                &mut self.conn,
                ids,
                jobs::owner,
                owner,
                held,
                to,
                next_owner,
            ))
    }
    fn record_statements(&mut self) -> Arc<Mutex<Vec<String>>> {
        let statements = Arc::new(Mutex::new(Vec::new()));
        diesel_async::AsyncConnection::set_instrumentation(&mut self.conn, recorder(&statements));
        statements
    }
    fn record_cached(&mut self) -> Arc<Mutex<Vec<String>>> {
        let statements = Arc::new(Mutex::new(Vec::new()));
        diesel_async::AsyncConnection::set_instrumentation(
            &mut self.conn,
            cache_recorder(&statements),
        );
        statements
    }
    fn end_session(&mut self, backend: &str) {
        if let Some(sql) = ending_own_session(backend) {
            // Answered with the end of the session itself, or not at all.
            let _ = self.runtime.block_on(self.conn.batch_execute(sql));
        }
    }
}

/// Claims of `jobs` rows inside transactions of the caller's.
pub trait ClaimInTransaction: ClaimWorker + Sized {
    /// Opens a transaction at isolation `level` ("rc" for the backend's default; "rr" and
    /// "ser", PostgreSQL only: REPEATABLE READ and SERIALIZABLE), runs `work` on this
    /// worker inside it, then commits when `work` answers `Ok` and rolls back otherwise:
    /// `work`'s answer, or the commit's failure.
    fn in_transaction_at<R>(
        &mut self,
        level: &str,
        work: impl FnOnce(&mut Self) -> Result<R, Error>,
    ) -> Result<R, Error>;
    /// How many `jobs` rows (of `owner`, or all) this worker's connection sees.
    fn count_jobs(&mut self, owner: Option<&str>) -> Result<i64, Error>;
}

/// The statement that sets a transaction's isolation `level`, first in the transaction.
fn set_isolation(level: &str) -> Option<&'static str> {
    match level {
        "rr" => Some("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"),
        "ser" => Some("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"),
        _ => None,
    }
}

/// The count [`ClaimInTransaction::count_jobs`] reads.
fn count_sql(owner: Option<&str>) -> String {
    match owner {
        Some(owner) => format!("SELECT COUNT(*) AS n FROM jobs WHERE owner = '{owner}'"),
        None => "SELECT COUNT(*) AS n FROM jobs".to_string(),
    }
}

#[derive(diesel::QueryableByName)]
pub struct JobCount {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

impl<C> ClaimInTransaction for Blocking<C>
where
    Self: ClaimWorker,
    C: diesel::Connection,
    diesel::query_builder::SqlQuery: diesel::query_dsl::LoadQuery<'static, C, JobCount>,
{
    fn in_transaction_at<R>(
        &mut self,
        level: &str,
        work: impl FnOnce(&mut Self) -> Result<R, Error>,
    ) -> Result<R, Error> {
        use diesel::connection::TransactionManager;
        C::TransactionManager::begin_transaction(&mut self.0)?;
        let answer = match set_isolation(level) {
            Some(sql) => self.0.batch_execute(sql).map_err(Error::from),
            None => Ok(()),
        }
        .and_then(|()| work(self));
        match answer {
            Ok(answer) => {
                C::TransactionManager::commit_transaction(&mut self.0)?;
                Ok(answer)
            }
            Err(error) => {
                C::TransactionManager::rollback_transaction(&mut self.0)?;
                Err(error)
            }
        }
    }
    fn count_jobs(&mut self, owner: Option<&str>) -> Result<i64, Error> {
        Ok(diesel::sql_query(count_sql(owner))
            .get_result::<JobCount>(&mut self.0)?
            .n)
    }
}

impl<A> ClaimInTransaction for Async<A>
where
    Self: ClaimWorker,
    A: diesel_async::AsyncConnection,
    diesel::query_builder::SqlQuery: diesel_async::methods::LoadQuery<'static, A, JobCount>,
{
    fn in_transaction_at<R>(
        &mut self,
        level: &str,
        work: impl FnOnce(&mut Self) -> Result<R, Error>,
    ) -> Result<R, Error> {
        use diesel_async::TransactionManager;
        self.runtime
            .block_on(A::TransactionManager::begin_transaction(&mut self.conn))?;
        let answer = match set_isolation(level) {
            Some(sql) => self
                .runtime
                .block_on(self.conn.batch_execute(sql))
                .map_err(Error::from),
            None => Ok(()),
        }
        .and_then(|()| work(self));
        match answer {
            Ok(answer) => {
                self.runtime
                    .block_on(A::TransactionManager::commit_transaction(&mut self.conn))?;
                Ok(answer)
            }
            Err(error) => {
                self.runtime
                    .block_on(A::TransactionManager::rollback_transaction(&mut self.conn))?;
                Err(error)
            }
        }
    }
    fn count_jobs(&mut self, owner: Option<&str>) -> Result<i64, Error> {
        let read = diesel_async::RunQueryDsl::get_result::<JobCount>(
            diesel::sql_query(count_sql(owner)),
            &mut self.conn,
        );
        Ok(self.runtime.block_on(read)?.n)
    }
}

/// Claims on any table (entity `T`, owner column `O`, claim-time column `At`), for the
/// bodies whose rows are not `jobs` (a two-column key, a loosely compared key): the
/// library's `GuardedClaim`, or `AsyncGuardedClaim`.
pub trait ClaimTable<T: HasStatus, O, At> {
    fn claim_rows(
        &mut self,
        owner: O,
        claimed_at: At,
        request: &ClaimRequest<'_, T::Status>,
    ) -> Result<Vec<T>, Error>;
    fn end_claim(
        &mut self,
        key: &T::Key,
        owner_column: O,
        owner: &str,
        held: T::Status,
        to: T::Status,
        next_owner: Option<&str>,
    ) -> Result<(), Error>;
    #[allow(clippy::too_many_arguments)]
    fn end_claims(
        &mut self,
        keys: &[T::Key],
        owner_column: O,
        owner: &str,
        held: T::Status,
        to: T::Status,
        next_owner: Option<&str>,
    ) -> Result<FinishedClaims<T::Key>, Error>;
}

impl<C, T, O, At> ClaimTable<T, O, At> for Blocking<C>
where
    C: diesel::Connection,
    T: ClaimRows<C, O, At> + FinishClaim<C, O> + FinishClaims<C, O>,
    T::Guard: AdvanceInSql,
{
    fn claim_rows(
        &mut self,
        owner: O,
        claimed_at: At,
        request: &ClaimRequest<'_, T::Status>,
    ) -> Result<Vec<T>, Error> {
        <T as GuardedClaim>::claim(&mut self.0, owner, claimed_at, request)
    }
    fn end_claim(
        &mut self,
        key: &T::Key,
        owner_column: O,
        owner: &str,
        held: T::Status,
        to: T::Status,
        next_owner: Option<&str>,
    ) -> Result<(), Error> {
        <T as GuardedClaim>::finish_claim(
            &mut self.0,
            key,
            owner_column,
            owner,
            held,
            to,
            next_owner,
        )
    }
    fn end_claims(
        &mut self,
        keys: &[T::Key],
        owner_column: O,
        owner: &str,
        held: T::Status,
        to: T::Status,
        next_owner: Option<&str>,
    ) -> Result<FinishedClaims<T::Key>, Error> {
        <T as GuardedClaim>::finish_claims(
            &mut self.0,
            keys,
            owner_column,
            owner,
            held,
            to,
            next_owner,
        )
    }
}

impl<A, T, O, At> ClaimTable<T, O, At> for Async<A>
where
    A: diesel_async::AsyncConnection,
    T: HasStatus + Clone,
    T::Guard: AdvanceInSql,
    op::Claim<T, O, At>: AsyncRun<A>,
    op::EndClaim<T, O>: AsyncRun<A>,
    op::EndClaims<T, O>: AsyncRun<A>,
{
    fn claim_rows(
        &mut self,
        owner: O,
        claimed_at: At,
        request: &ClaimRequest<'_, T::Status>,
    ) -> Result<Vec<T>, Error> {
        self.runtime.block_on(<T as AsyncGuardedClaim>::claim(
            &mut self.conn,
            owner,
            claimed_at,
            request,
        ))
    }
    fn end_claim(
        &mut self,
        key: &T::Key,
        owner_column: O,
        owner: &str,
        held: T::Status,
        to: T::Status,
        next_owner: Option<&str>,
    ) -> Result<(), Error> {
        self.runtime
            .block_on(<T as AsyncGuardedClaim>::finish_claim(
                &mut self.conn,
                key,
                owner_column,
                owner,
                held,
                to,
                next_owner,
            ))
    }
    fn end_claims(
        &mut self,
        keys: &[T::Key],
        owner_column: O,
        owner: &str,
        held: T::Status,
        to: T::Status,
        next_owner: Option<&str>,
    ) -> Result<FinishedClaims<T::Key>, Error> {
        self.runtime
            .block_on(<T as AsyncGuardedClaim>::finish_claims(
                &mut self.conn,
                keys,
                owner_column,
                owner,
                held,
                to,
                next_owner,
            ))
    }
}

/// Writes each claim test body once per executor (see `tests_on_both_paths!`), each on a
/// fresh database with the `jobs` table.
#[macro_export]
macro_rules! claim_tests_on_both_paths {
    ($($body:ident),* $(,)?) => {
        tests_on_both_paths!(
            |db: &common::TestDb<Conn>| common::claim_paths::create_jobs(&mut *db.conn(), BACKEND);
            $($body),*
        );
    };
}
