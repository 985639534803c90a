//! Locks and leases in the library's `occ_locks` table, on the same
//! compare-and-set executor as every other write.
//!
//! A lock is a row per (name, resource) that is never deleted. Taking it is one guarded
//! `UPDATE ... WHERE <key> AND (holder IS NULL OR expires_at < <database now>)` that sets
//! a new random holder token, raises the fencing token and sets the expiry from the
//! database's clock; the affected row count decides, and the new fence comes back with the
//! statement (`RETURNING`, or a read in the same transaction on MySQL). So:
//!
//! - expiry is judged by the database's clock only (PostgreSQL `clock_timestamp()`, MySQL
//!   `UTC_TIMESTAMP(6)`, SQLite `strftime('%f')` text of fixed width), never by a
//!   caller's, which may be skewed;
//! - renewing and releasing need the holder's token *and* fence, so nobody releases a lock
//!   they do not hold, and a holder whose lease was taken over learns it
//!   ([`Error::LockLost`]);
//! - the fence rises on every acquisition and is never reused (the row stays on release),
//!   so storage can refuse a paused holder's late writes ([`fence`](crate::fence)).
//!
//! Locks are not re-entrant: every acquisition makes a new holder, so a second
//! `try_lock` of a lock you hold is refused like anyone else's ([`Error::LockHeld`]).
//! Dropping a [`LockGuard`] releases it, best effort (a connection from the pool, errors
//! ignored); call [`LockGuard::release`] to learn the outcome.

use std::time::Duration;

use diesel::connection::LoadConnection;
use diesel::query_builder::{AsChangeset, AstPass, QueryFragment, QueryId};
use diesel::query_dsl::methods::LoadQuery;
use diesel::r2d2::{ManageConnection, Pool, PooledConnection, R2D2Connection};
use diesel::serialize::ToSql;
use diesel::sql_types::{Nullable, Text};
use diesel::{OptionalExtension, QueryResult, RunQueryDsl};

use crate::backend::OccBackend;
use crate::completion::{Complete, Counted, ReturnedBy};
use crate::database_clock::{ServerClock, Shift};
use crate::error::Error;
use crate::retry::RetryPolicy;
use crate::statement::{CompareAndSet, GuardedUpdate, Unguarded};
use crate::update::{classify, execute_guarded};
use crate::version_row::check_name;

diesel::table! {
    /// The library's locks and leases.
    occ_locks (lock_name, resource) {
        /// What is locked ("nightly-report").
        lock_name -> Text,
        /// Which instance of it ("2026-11-22").
        resource -> Text,
        /// The random token of the current holder; NULL when free.
        holder -> Nullable<Text>,
        /// The holder's label, for people reading the table.
        label -> Nullable<Text>,
        /// Raised on every acquisition.
        fence -> BigInt,
        /// How many times the lock was taken.
        holder_changes -> BigInt,
        /// When the current holder took it (database clock, UTC).
        acquired_at -> Nullable<Timestamp>,
        /// When the current holder last renewed it.
        renewed_at -> Nullable<Timestamp>,
        /// When the current lease ends.
        expires_at -> Nullable<Timestamp>,
    }
}

/// The longest lease: a day. A longer one is a mistake of units, and would hold a lock
/// for that long after its holder died.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// `lock_name = ? AND resource = ?`.
#[derive(Debug, Clone)]
pub struct LockKey {
    name: String,
    resource: String,
}

impl<DB: OccBackend> QueryFragment<DB> for LockKey
where
    str: ToSql<Text, DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_sql("lock_name = ");
        out.push_bind_param::<Text, str>(&self.name)?;
        out.push_sql(" AND resource = ");
        out.push_bind_param::<Text, str>(&self.resource)
    }
}

/// What a lock statement sets or checks, as SQL over `occ_locks`.
#[derive(Debug, Clone)]
pub enum LockSql {
    /// `SET holder = ?, label = ?, fence = fence + 1, ... expires_at = now + ttl`.
    Acquire {
        /// The new holder's token.
        holder: String,
        /// Its label.
        label: Option<String>,
        /// Now.
        now: Shift,
        /// Now plus the lease.
        expires: Shift,
    },
    /// `SET renewed_at = now, expires_at = now + ttl`.
    Renew {
        /// Now.
        now: Shift,
        /// Now plus the lease.
        expires: Shift,
    },
    /// `SET holder = NULL, label = NULL, expires_at = NULL`.
    Release,
    /// `(holder IS NULL OR expires_at < now)`.
    FreeOrExpired {
        /// Now.
        now: Shift,
    },
    /// `holder = ? AND fence = ?`, and `expires_at >= now` when `now` is given.
    HeldBy {
        /// The holder's token.
        holder: String,
        /// Its fence.
        fence: i64,
        /// Now, when the lease must not have ended.
        now: Option<Shift>,
    },
}

impl<DB> QueryFragment<DB> for LockSql
where
    DB: OccBackend + ServerClock,
    str: ToSql<Text, DB>,
    i64: ToSql<diesel::sql_types::BigInt, DB>,
    Option<String>: ToSql<Nullable<Text>, DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        match self {
            LockSql::Acquire {
                holder,
                label,
                now,
                expires,
            } => {
                out.push_sql("holder = ");
                out.push_bind_param::<Text, str>(holder)?;
                out.push_sql(", label = ");
                out.push_bind_param::<Nullable<Text>, Option<String>>(label)?;
                out.push_sql(", fence = fence + 1, holder_changes = holder_changes + 1");
                for column in ["acquired_at", "renewed_at"] {
                    out.push_sql(&format!(", {column} = "));
                    DB::push_shifted(&mut out, now)?;
                }
                out.push_sql(", expires_at = ");
                DB::push_shifted(&mut out, expires)
            }
            LockSql::Renew { now, expires } => {
                out.push_sql("renewed_at = ");
                DB::push_shifted(&mut out, now)?;
                out.push_sql(", expires_at = ");
                DB::push_shifted(&mut out, expires)
            }
            LockSql::Release => {
                out.push_sql("holder = NULL, label = NULL, expires_at = NULL");
                Ok(())
            }
            LockSql::FreeOrExpired { now } => {
                out.push_sql("(holder IS NULL OR expires_at < ");
                DB::push_shifted(&mut out, now)?;
                out.push_sql(")");
                Ok(())
            }
            LockSql::HeldBy { holder, fence, now } => {
                out.push_sql("holder = ");
                out.push_bind_param::<Text, str>(holder)?;
                out.push_sql(" AND fence = ");
                out.push_bind_param::<diesel::sql_types::BigInt, i64>(fence)?;
                if let Some(now) = now {
                    out.push_sql(" AND expires_at >= ");
                    DB::push_shifted(&mut out, now)?;
                }
                Ok(())
            }
        }
    }
}

impl QueryId for LockSql {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl AsChangeset for LockSql {
    type Target = occ_locks::table;
    type Changeset = Self;
    fn as_changeset(self) -> Self {
        self
    }
}

/// A statement on one lock row.
pub type LockUpdate = GuardedUpdate<occ_locks::table, LockSql, Unguarded, LockKey, LockSql>;

/// `INSERT` of a free lock row unless it exists.
#[derive(Debug)]
pub struct CreateLock<'a>(&'a LockKey);

impl<DB: OccBackend> QueryFragment<DB> for CreateLock<'_>
where
    str: ToSql<Text, DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_sql("INSERT INTO occ_locks (lock_name, resource, fence, holder_changes) VALUES (");
        out.push_bind_param::<Text, str>(&self.0.name)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, str>(&self.0.resource)?;
        out.push_sql(", 0, 0)");
        out.push_sql(match DB::DUPLICATES {
            crate::backend::Duplicates::OnConflict => " ON CONFLICT DO NOTHING",
            crate::backend::Duplicates::OnDuplicateKey => " ON DUPLICATE KEY UPDATE fence = fence",
        });
        Ok(())
    }
}

impl QueryId for CreateLock<'_> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

/// A connection locks can run on: the three statements of a lock, written once for every
/// connection whose backend they fit.
pub trait LockConnection {
    /// Takes the lock for `holder` if it is free or expired; its new fence.
    fn acquire_lock(
        &mut self,
        key: &LockKey,
        holder: &str,
        label: Option<&str>,
        ttl: Duration,
    ) -> Result<i64, Error>;

    /// Extends `holder`'s unexpired lease to `ttl` from now.
    fn renew_lock(
        &mut self,
        key: &LockKey,
        holder: &str,
        fence: i64,
        ttl: Duration,
    ) -> Result<(), Error>;

    /// Frees the lock if `holder` still holds it with `fence`.
    fn release_lock(&mut self, key: &LockKey, holder: &str, fence: i64) -> Result<(), Error>;
}

impl<C> LockConnection for C
where
    C: LoadConnection,
    C::Backend: OccBackend + ServerClock,
    LockUpdate: CompareAndSet<C::Backend>,
    for<'a> CreateLock<'a>: QueryFragment<C::Backend>,
    ReturnedBy<occ_locks::fence>: Complete<C, LockUpdate, i64>,
    Counted: Complete<C, LockUpdate, i64>,
    LockHolder: LoadQuery<'static, C, (Option<String>, Option<chrono::NaiveDateTime>)>,
{
    fn acquire_lock(
        &mut self,
        key: &LockKey,
        holder: &str,
        label: Option<&str>,
        ttl: Duration,
    ) -> Result<i64, Error> {
        self.execute_returning_count(&CreateLock(key))
            .map_err(|e| classify(self, e))?;
        let statement = LockUpdate::new(
            occ_locks::table,
            LockSql::Acquire {
                holder: holder.to_string(),
                label: label.map(str::to_string),
                now: Shift::none(),
                expires: Shift::later(ttl),
            },
            Unguarded,
            key.clone(),
            LockSql::FreeOrExpired { now: Shift::none() },
        );
        execute_guarded::<_, _, ReturnedBy<occ_locks::fence>, i64>(
            self,
            statement,
            || ("occ_locks", describe(key)),
            |conn| held(conn, key),
        )?
        .ok_or_else(|| {
            Error::Database(diesel::result::Error::QueryBuilderError(
                "the lock was taken but its fence was not read back".into(),
            ))
        })
    }

    fn renew_lock(
        &mut self,
        key: &LockKey,
        holder: &str,
        fence: i64,
        ttl: Duration,
    ) -> Result<(), Error> {
        let statement = LockUpdate::new(
            occ_locks::table,
            LockSql::Renew {
                now: Shift::none(),
                expires: Shift::later(ttl),
            },
            Unguarded,
            key.clone(),
            LockSql::HeldBy {
                holder: holder.to_string(),
                fence,
                now: Some(Shift::none()),
            },
        );
        execute_guarded::<_, _, Counted, i64>(
            self,
            statement,
            || ("occ_locks", describe(key)),
            |_| lost(key),
        )
        .map(drop)
    }

    fn release_lock(&mut self, key: &LockKey, holder: &str, fence: i64) -> Result<(), Error> {
        let statement = LockUpdate::new(
            occ_locks::table,
            LockSql::Release,
            Unguarded,
            key.clone(),
            LockSql::HeldBy {
                holder: holder.to_string(),
                fence,
                now: None,
            },
        );
        execute_guarded::<_, _, Counted, i64>(
            self,
            statement,
            || ("occ_locks", describe(key)),
            |_| lost(key),
        )
        .map(drop)
    }
}

/// Locks taken with connections from a pool.
pub struct Locks<M: ManageConnection> {
    pool: Pool<M>,
}

impl<M: ManageConnection> Clone for Locks<M> {
    fn clone(&self) -> Self {
        Locks {
            pool: self.pool.clone(),
        }
    }
}

/// A lock held: its fencing token, and renew and release. Dropping it releases it, best
/// effort.
pub struct LockGuard<M: ManageConnection>
where
    M::Connection: R2D2Connection + Send + 'static,
    PooledConnection<M>: LockConnection,
{
    pool: Pool<M>,
    key: LockKey,
    holder: String,
    fence: i64,
    ttl: Duration,
    released: bool,
}

impl<M: ManageConnection> Locks<M>
where
    M::Connection: R2D2Connection + Send + 'static,
    PooledConnection<M>: LockConnection,
{
    /// Locks whose statements run on connections from `pool`.
    pub fn new(pool: Pool<M>) -> Self {
        Locks { pool }
    }

    /// Takes the lock `(name, resource)` for `ttl` if it is free or its lease ended, else
    /// [`Error::LockHeld`] with its holder's label and the end of its lease. `label` names
    /// the holder for people (a host and process), never for the check.
    pub fn try_lock(
        &self,
        name: &str,
        resource: &str,
        ttl: Duration,
        label: Option<&str>,
    ) -> Result<LockGuard<M>, Error> {
        check_name("lock name", name)?;
        check_name("resource", resource)?;
        if let Some(label) = label {
            check_name("label", label)?;
        }
        check_ttl(ttl)?;
        let key = LockKey {
            name: name.to_string(),
            resource: resource.to_string(),
        };
        let holder = holder_token()?;
        let fence = self.pool.get()?.acquire_lock(&key, &holder, label, ttl)?;
        Ok(LockGuard {
            pool: self.pool.clone(),
            key,
            holder,
            fence,
            ttl,
            released: false,
        })
    }

    /// [`try_lock`](Self::try_lock), trying again while the lock is held, for at most
    /// `wait`, with waits drawn as `policy` draws them. [`Error::LockHeld`] when the wait
    /// is over.
    pub fn lock(
        &self,
        name: &str,
        resource: &str,
        ttl: Duration,
        label: Option<&str>,
        wait: Duration,
        policy: &RetryPolicy,
    ) -> Result<LockGuard<M>, Error> {
        policy.poll(
            wait,
            |error| matches!(error, Error::LockHeld { .. }),
            || self.try_lock(name, resource, ttl, label),
        )
    }
}

impl<M: ManageConnection> LockGuard<M>
where
    M::Connection: R2D2Connection + Send + 'static,
    PooledConnection<M>: LockConnection,
{
    /// The fencing token of this acquisition: larger than every earlier holder's.
    pub fn fence(&self) -> i64 {
        self.fence
    }

    /// This holder's random token.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// The lease each renewal grants.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The lock's name and resource, for messages.
    pub fn describe(&self) -> String {
        describe(&self.key)
    }

    /// A renewal of this lease that another thread can run (on its own connections).
    pub(crate) fn renewer(&self) -> impl FnMut() -> Result<(), Error> + Send + 'static {
        let (pool, key, holder, fence, ttl) = (
            self.pool.clone(),
            self.key.clone(),
            self.holder.clone(),
            self.fence,
            self.ttl,
        );
        move || pool.get()?.renew_lock(&key, &holder, fence, ttl)
    }

    /// Extends the lease to `ttl` from now (database clock). [`Error::LockLost`] when the
    /// lease already ended or another holder took the lock: stop the work it protects.
    pub fn renew(&mut self) -> Result<(), Error> {
        let (key, holder) = (&self.key, &self.holder);
        self.pool
            .get()?
            .renew_lock(key, holder, self.fence, self.ttl)
    }

    /// Frees the lock, keeping its row (so the fence keeps rising). [`Error::LockLost`]
    /// when another holder took it over meanwhile.
    ///
    /// When the release fails otherwise (its connection died: [`Error::Ambiguous`], no
    /// pooled connection, ...), the guard's drop tries once more on another connection,
    /// as it does for a guard that was never released, so a lost connection does not keep
    /// the lock held until its lease ends. Releasing twice is harmless: the owner check
    /// makes the second one match nothing.
    pub fn release(mut self) -> Result<(), Error> {
        let result = self.free();
        self.released = !matches!(&result, Err(e) if !matches!(e, Error::LockLost { .. }));
        result
    }

    fn free(&self) -> Result<(), Error> {
        self.pool
            .get()?
            .release_lock(&self.key, &self.holder, self.fence)
    }
}

impl<M: ManageConnection> std::fmt::Debug for Locks<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Locks").finish_non_exhaustive()
    }
}

impl<M: ManageConnection> std::fmt::Debug for LockGuard<M>
where
    M::Connection: R2D2Connection + Send + 'static,
    PooledConnection<M>: LockConnection,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("lock", &describe(&self.key))
            .field("fence", &self.fence)
            .field("ttl", &self.ttl)
            .field("released", &self.released)
            .finish_non_exhaustive()
    }
}

impl<M: ManageConnection> Drop for LockGuard<M>
where
    M::Connection: R2D2Connection + Send + 'static,
    PooledConnection<M>: LockConnection,
{
    fn drop(&mut self) {
        if !self.released {
            // Best effort: a lock that cannot be released now ends with its lease.
            let _ = self.free();
        }
    }
}

/// `SELECT label, expires_at FROM occ_locks WHERE <key>`: who holds a lock, until when.
#[derive(Debug, Clone)]
pub struct LockHolder(LockKey);

impl diesel::query_builder::Query for LockHolder {
    type SqlType = (Nullable<Text>, Nullable<diesel::sql_types::Timestamp>);
}

impl<DB: OccBackend> QueryFragment<DB> for LockHolder
where
    LockKey: QueryFragment<DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_sql("SELECT label, expires_at FROM occ_locks WHERE ");
        self.0.walk_ast(out.reborrow())
    }
}

impl QueryId for LockHolder {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<Conn> RunQueryDsl<Conn> for LockHolder {}

/// Why the lock could not be taken: who holds it and until when.
fn held<C>(conn: &mut C, key: &LockKey) -> Error
where
    C: LoadConnection,
    C::Backend: OccBackend,
    LockHolder: LoadQuery<'static, C, (Option<String>, Option<chrono::NaiveDateTime>)>,
{
    let row = LockHolder(key.clone())
        .get_result::<(Option<String>, Option<chrono::NaiveDateTime>)>(conn)
        .optional();
    match row {
        Ok(Some((label, until))) => Error::LockHeld {
            lock: describe(key),
            holder: label,
            until: until.map(|t| t.format("%Y-%m-%d %H:%M:%S%.6f UTC").to_string()),
        },
        Ok(None) => Error::LockHeld {
            lock: describe(key),
            holder: None,
            until: None,
        },
        Err(e) => classify(conn, e),
    }
}

fn lost(key: &LockKey) -> Error {
    Error::LockLost {
        lock: describe(key),
    }
}

fn describe(key: &LockKey) -> String {
    format!("{}/{}", key.name, key.resource)
}

/// A lease must be at least a millisecond (SQLite's clock) and at most [`MAX_TTL`].
fn check_ttl(ttl: Duration) -> Result<(), Error> {
    if ttl < Duration::from_millis(1) || ttl > MAX_TTL {
        return Err(Error::InvalidSetting {
            what: "lease (TTL)",
            reason: format!("{ttl:?} is not between 1 ms and {MAX_TTL:?}"),
        });
    }
    Ok(())
}

/// A random holder token: 128 bits from the operating system, as hex.
fn holder_token() -> Result<String, Error> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| Error::InvalidSetting {
        what: "holder token",
        reason: format!("the operating system gave no random bytes: {e}"),
    })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
