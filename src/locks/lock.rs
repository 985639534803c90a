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
//!   so storage can refuse a paused holder's late writes ([`fence`](crate::locks::fence)).
//!
//! Locks are not re-entrant: every acquisition makes a new holder, so a second
//! `try_lock` of a lock you hold is refused like anyone else's ([`Error::LockHeld`]).
//! Dropping a [`LockGuard`] releases it, best effort (a connection from the pool, errors
//! ignored); call [`LockGuard::release`] to learn the outcome.

use std::time::Duration;

use diesel::connection::LoadConnection;
use diesel::dsl::{Find, Select};
use diesel::query_builder::InsertStatement;
use diesel::query_dsl::methods::{ExecuteDsl, LoadQuery};
use diesel::r2d2::{ManageConnection, Pool, PooledConnection, R2D2Connection};
use diesel::{Insertable, OptionalExtension, QueryDsl, RunQueryDsl};

use crate::connect::backend::OccBackend;
use crate::error::Error;
use crate::guard::server_clock::{ClockColumn, ServerClock, Shift};
use crate::retry::RetryPolicy;
use crate::sql::names::check_name;
use crate::sql::new_token::{Complete, Counted, ReturnedBy};
use crate::sql::statement::{
    And, Assignments, ColumnEq, Comma, Either, GuardedUpdate, Increment, InsertIfMissing, Joined,
    Null, Unguarded,
};
use crate::write::executor::{classify, CannotMiss, CompareAndSet, Matches, Miss};

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

/// Which lock: its name and resource.
#[derive(Debug, Clone)]
pub struct LockKey {
    name: String,
    resource: String,
}

impl LockKey {
    /// `lock_name = ? AND resource = ?`.
    fn predicate(&self) -> KeyOf {
        Joined(
            ColumnEq::new(self.name.clone()),
            ColumnEq::new(self.resource.clone()),
            And,
        )
    }
}

/// `lock_name = ? AND resource = ?`.
type KeyOf =
    Joined<ColumnEq<occ_locks::lock_name, String>, ColumnEq<occ_locks::resource, String>, And>;

/// `holder = ? AND fence = ?`: the lock is still this holder's.
type HeldBy = Joined<ColumnEq<occ_locks::holder, String>, ColumnEq<occ_locks::fence, i64>, And>;

/// A statement on one lock row: `UPDATE occ_locks SET <Set> WHERE <key> AND <Guard>`.
type LockUpdate<Set, Guard> = GuardedUpdate<occ_locks::table, Set, Unguarded, KeyOf, Guard>;

/// Taking the lock: `SET holder = ?, label = ?, fence = fence + 1, holder_changes =
/// holder_changes + 1, acquired_at = now, renewed_at = now, expires_at = now + ttl WHERE
/// <key> AND (holder IS NULL OR (expires_at IS NULL OR expires_at < now))`.
pub(crate) type AcquireLock = LockUpdate<
    Joined<
        Joined<
            Joined<
                ColumnEq<occ_locks::holder, String>,
                ColumnEq<occ_locks::label, Option<String>>,
                Comma,
            >,
            Joined<Increment<occ_locks::fence>, Increment<occ_locks::holder_changes>, Comma>,
            Comma,
        >,
        Joined<
            Joined<ClockColumn<occ_locks::acquired_at>, ClockColumn<occ_locks::renewed_at>, Comma>,
            ClockColumn<occ_locks::expires_at>,
            Comma,
        >,
        Comma,
    >,
    Either<
        Null<occ_locks::holder>,
        Either<Null<occ_locks::expires_at>, ClockColumn<occ_locks::expires_at>>,
    >,
>;

/// Renewing the lease: `SET renewed_at = now, expires_at = now + ttl WHERE <key> AND
/// holder = ? AND fence = ? AND expires_at >= now`.
pub(crate) type RenewLock = LockUpdate<
    Joined<ClockColumn<occ_locks::renewed_at>, ClockColumn<occ_locks::expires_at>, Comma>,
    Joined<HeldBy, ClockColumn<occ_locks::expires_at>, And>,
>;

/// Releasing the lock: `SET holder = NULL, label = NULL, expires_at = NULL WHERE <key>
/// AND holder = ? AND fence = ?`.
pub(crate) type ReleaseLock = LockUpdate<
    Joined<
        Joined<Null<occ_locks::holder>, Null<occ_locks::label>, Comma>,
        Null<occ_locks::expires_at>,
        Comma,
    >,
    HeldBy,
>;

/// A free lock row, inserted on first use.
#[doc(hidden)]
#[derive(Debug, Insertable)]
#[diesel(table_name = occ_locks)]
pub struct NewLock {
    lock_name: String,
    resource: String,
    fence: i64,
    holder_changes: i64,
}

/// `INSERT` of a free lock row unless it exists.
pub(crate) type CreateLock = InsertIfMissing<
    InsertStatement<occ_locks::table, <NewLock as Insertable<occ_locks::table>>::Values>,
    occ_locks::fence,
>;

/// `SELECT label, expires_at FROM occ_locks WHERE <key>`: who holds a lock, until when.
pub(crate) type LockHolder =
    Select<Find<occ_locks::table, (String, String)>, (occ_locks::label, occ_locks::expires_at)>;

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
    AcquireLock: Assignments<C::Backend>,
    RenewLock: Assignments<C::Backend>,
    ReleaseLock: Assignments<C::Backend>,
    CreateLock: Assignments<C::Backend> + ExecuteDsl<C>,
    ReturnedBy<occ_locks::fence>: Complete<C, AcquireLock, i64>,
    Counted: Complete<C, RenewLock, i64> + Complete<C, ReleaseLock, i64>,
    LockHolder: LoadQuery<'static, C, (Option<String>, Option<chrono::NaiveDateTime>)>,
{
    fn acquire_lock(
        &mut self,
        key: &LockKey,
        holder: &str,
        label: Option<&str>,
        ttl: Duration,
    ) -> Result<i64, Error> {
        let create = InsertIfMissing::new(diesel::insert_into(occ_locks::table).values(NewLock {
            lock_name: key.name.clone(),
            resource: key.resource.clone(),
            fence: 0,
            holder_changes: 0,
        }));
        CompareAndSet::one(create, "occ_locks", key, CannotMiss)
            .matching(Matches::Any)
            .run::<C, Counted, i64>(self)?;
        let statement = AcquireLock::new(
            occ_locks::table,
            Joined(
                Joined(
                    Joined(
                        ColumnEq::new(holder.to_string()),
                        ColumnEq::new(label.map(str::to_string)),
                        Comma,
                    ),
                    Joined(Increment::default(), Increment::default(), Comma),
                    Comma,
                ),
                Joined(
                    Joined(
                        ClockColumn::set(Shift::none()),
                        ClockColumn::set(Shift::none()),
                        Comma,
                    ),
                    ClockColumn::set(Shift::later(ttl)),
                    Comma,
                ),
                Comma,
            ),
            Unguarded,
            key.predicate(),
            // A held row without an expiry (written by hand) would block its lock for ever:
            // it counts as expired.
            Either(
                Null::test(),
                Either(Null::test(), ClockColumn::before(Shift::none())),
            ),
        );
        CompareAndSet::one(statement, "occ_locks", key, LockTaken { key })
            .run::<C, ReturnedBy<occ_locks::fence>, i64>(self)?
            .token
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
        let statement = RenewLock::new(
            occ_locks::table,
            Joined(
                ClockColumn::set(Shift::none()),
                ClockColumn::set(Shift::later(ttl)),
                Comma,
            ),
            Unguarded,
            key.predicate(),
            Joined(
                held_by(holder, fence),
                ClockColumn::not_before(Shift::none()),
                And,
            ),
        );
        CompareAndSet::one(statement, "occ_locks", key, LeaseLost { key })
            .run::<C, Counted, i64>(self)
            .map(drop)
    }

    fn release_lock(&mut self, key: &LockKey, holder: &str, fence: i64) -> Result<(), Error> {
        let statement = ReleaseLock::new(
            occ_locks::table,
            Joined(Joined(Null::set(), Null::set(), Comma), Null::set(), Comma),
            Unguarded,
            key.predicate(),
            held_by(holder, fence),
        );
        CompareAndSet::one(statement, "occ_locks", key, LeaseLost { key })
            .run::<C, Counted, i64>(self)
            .map(drop)
    }
}

/// `holder = ? AND fence = ?`.
fn held_by(holder: &str, fence: i64) -> HeldBy {
    Joined(ColumnEq::new(holder.to_string()), ColumnEq::new(fence), And)
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

    /// [`try_lock`](Self::try_lock), trying again while the lock is held or the database
    /// refuses for now ([`Error::Retryable`]), for at most `wait`, with waits drawn as
    /// `policy` draws them. The last such error when the wait is over.
    pub fn lock(
        &self,
        name: &str,
        resource: &str,
        ttl: Duration,
        label: Option<&str>,
        wait: Duration,
        policy: &RetryPolicy,
    ) -> Result<LockGuard<M>, Error> {
        // Held, or refused for now by the database (a serialization failure under
        // REPEATABLE READ or SERIALIZABLE sessions, a deadlock, SQLite busy): wait on.
        policy.poll(
            wait,
            |error| matches!(error, Error::LockHeld { .. } | Error::Retryable { .. }),
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

/// The lock could not be taken: someone holds it. Who, and until when, is read back for
/// the message ([`Error::LockHeld`]).
struct LockTaken<'k> {
    key: &'k LockKey,
}

impl<C> Miss<C> for LockTaken<'_>
where
    C: LoadConnection,
    C::Backend: OccBackend,
    LockHolder: LoadQuery<'static, C, (Option<String>, Option<chrono::NaiveDateTime>)>,
{
    fn explain(self, conn: &mut C) -> Error {
        let key = self.key;
        let row = occ_locks::table
            .find((key.name.clone(), key.resource.clone()))
            .select((occ_locks::label, occ_locks::expires_at))
            .get_result::<(Option<String>, Option<chrono::NaiveDateTime>)>(conn)
            .optional();
        let (holder, until) = match row {
            Ok(Some((label, until))) => (label, until),
            Ok(None) => (None, None),
            Err(e) => return classify(conn, e),
        };
        Error::LockHeld {
            lock: describe(key),
            holder,
            until: until.map(|t| t.format("%Y-%m-%d %H:%M:%S%.6f UTC").to_string()),
        }
    }
}

/// A renewal or release matched nothing: the lease ended or another holder took the
/// lock ([`Error::LockLost`]). Nothing to read: either way this holder must stop.
struct LeaseLost<'k> {
    key: &'k LockKey,
}

impl<C> Miss<C> for LeaseLost<'_> {
    fn explain(self, _: &mut C) -> Error {
        Error::LockLost {
            lock: describe(self.key),
        }
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
