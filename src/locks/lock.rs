//! Locks and leases in the library's `occ_locks` table, on the same
//! compare-and-set executor as every other write.
//!
//! A lock is a row per (name, resource). Taking it is one short transaction: lock the row
//! (creating it on first use), then one guarded `UPDATE ... WHERE <key> AND (holder IS
//! NULL OR expires_at < <database now>)` that sets a new random holder token, a new
//! fencing token and the expiry from the database's clock; the affected row count decides,
//! and the new fence comes back with the statement (`RETURNING`, or a read in the same
//! transaction on MySQL). So:
//!
//! - the expiry is computed after every wait: the statements that can wait (for the row
//!   lock of a session holding the row, a busy database) run before the `UPDATE`, whose
//!   own row lock is then already held. A statement that computed the expiry first and
//!   then waited (PostgreSQL evaluates `clock_timestamp()` before a row-lock wait and does
//!   not evaluate it again when the blocker did not change the row) would store a lease
//!   already over when it ends. A renewal likewise checks the lease after its waits, so a
//!   renewal that arrives after the lease ended is [`Error::LockLost`], never a success;
//! - every statement waits at most a bound derived from the lease: a third of it, and
//!   never past the holder's local deadline
//!   ([`LockBackend`](crate::locks::backend::LockBackend) says how per backend);
//! - expiry is judged by the database's clock only (PostgreSQL `clock_timestamp()`, MySQL
//!   `UTC_TIMESTAMP(6)`, SQLite `strftime('%f')` text of fixed width), never by a
//!   caller's, which may be skewed;
//! - the holder's own belief ([`LockGuard::is_held`]) ends earlier than the database's
//!   lease: it is measured from before the request was sent, on the monotonic clock, less
//!   a safety margin, and a reply that comes back after it does not revive it;
//! - renewing and releasing need the holder's token *and* fence, so nobody releases a lock
//!   they do not hold, and a holder whose lease was taken over learns it, and from whom
//!   ([`Error::LockLost`]);
//! - fences come from a source that never goes back (a sequence, or on SQLite an
//!   `AUTOINCREMENT` key), so they rise on every acquisition even when the lock row was
//!   deleted or the table truncated, and storage can refuse a paused holder's late writes
//!   ([`FencedWrite`](crate::FencedWrite)).
//!
//! Locks are not re-entrant: every acquisition makes a new holder, so a second
//! `try_lock` of a lock you hold is refused like anyone else's ([`Error::LockHeld`]).
//! Dropping a [`LockGuard`] releases it, best effort (a connection from the pool, errors
//! ignored); call [`LockGuard::release`] to learn the outcome.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::connect::source::ConnectionSource;
use crate::flow::compare_and_set::{CompareAndSet, Matches};
use diesel::connection::{LoadConnection, SimpleConnection};
use diesel::dsl::{Find, Select};
use diesel::query_builder::InsertStatement;
use diesel::query_dsl::methods::{ExecuteDsl, LoadQuery};
use diesel::{Insertable, OptionalExtension, QueryDsl, RunQueryDsl};

use crate::connect::transaction::WriteTransaction;
use crate::drive::blocking::complete::Complete;
use crate::drive::blocking::executor::{classify, CannotMiss, Miss};
use crate::drive::{now, Blocking};
use crate::error::Error;
use crate::flow::lock_transaction::LockWrite;
use crate::guard::server_clock::{ClockColumn, Shift};
use crate::locks::backend::{LockBackend, NextFence};
use crate::locks::belief::{believed, Belief};
use crate::locks::held::{Held, Loss};
use crate::locks::lock_io::{check_held, write_lock};
use crate::retry::RetryPolicy;
use crate::sql::names::check_name;
use crate::sql::new_token::{Counted, ReturnedBy};
use crate::sql::statement::{
    And, Assignments, ColumnEq, ColumnOfRow, Comma, Either, GuardedUpdate, Increment,
    InsertIfMissing, Joined, LatestRead, Null, RowLock, Unguarded,
};

/// The database's clock against a lock time: an instant (see [`occ_locks`]).
type LockClock<Col> = ClockColumn<Col, chrono::DateTime<chrono::Utc>>;

diesel::table! {
    use diesel::sql_types::*;
    use crate::locks::lock_time::LockTime;

    /// The library's locks and leases.
    ///
    /// Times are written only by the database's own clock expression and compared only
    /// with it, so they order the same way on every backend: instants on PostgreSQL
    /// (`timestamptz`, `clock_timestamp()`), which no server or session time zone moves;
    /// UTC without a zone on MySQL (`DATETIME(6)`, `UTC_TIMESTAMP(6)`) and SQLite
    /// (`strftime` text of fixed width). Read as UTC `NaiveDateTime` ([`LockTime`](crate::LockTime)).
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
        acquired_at -> Nullable<LockTime>,
        /// When the current holder last renewed it.
        renewed_at -> Nullable<LockTime>,
        /// When the current lease ends.
        expires_at -> Nullable<LockTime>,
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
    /// `name/resource`, for messages.
    pub(crate) fn describe(&self) -> String {
        format!("{}/{}", self.name, self.resource)
    }

    /// The lock's name without its resource: a label of bounded cardinality.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// `name/resource` as a value to format, for reports that may not be formatted at
    /// all (the telemetry's, without a subscriber).
    pub(crate) fn shown(&self) -> ShownKey<'_> {
        ShownKey(self)
    }

    /// `lock_name = ? AND resource = ?`.
    fn predicate(&self) -> KeyOf {
        Joined(
            ColumnEq::new(self.name.clone()),
            ColumnEq::new(self.resource.clone()),
            And,
        )
    }

    /// The row's primary key.
    fn id(&self) -> (String, String) {
        (self.name.clone(), self.resource.clone())
    }

    /// `INSERT` of the lock's free row unless it exists.
    pub(crate) fn create_row(&self) -> CreateLock {
        InsertIfMissing::new(diesel::insert_into(occ_locks::table).values(NewLock {
            lock_name: self.name.clone(),
            resource: self.resource.clone(),
            fence: 0,
            holder_changes: 0,
        }))
    }

    /// `SELECT fence ... FOR UPDATE` of the lock's row.
    pub(crate) fn locked_row(&self) -> LockRow {
        LatestRead::locked(
            occ_locks::table.find(self.id()).select(occ_locks::fence),
            RowLock::ForUpdate,
        )
    }

    /// The lock's row `FOR UPDATE` while `holder` holds it with `fence` and an unexpired
    /// lease by the database's clock.
    pub(crate) fn held_row(&self, holder: &str, fence: i64) -> HeldRow {
        LatestRead::locked(
            ColumnOfRow::new(
                occ_locks::table,
                Joined(
                    Joined(self.predicate(), held_by(holder, fence), And),
                    ClockColumn::not_before(Shift::none()),
                    And,
                ),
            ),
            RowLock::ForUpdate,
        )
    }

    /// Who holds the lock, until when.
    pub(crate) fn holder_read(&self) -> LockHolder {
        occ_locks::table
            .find(self.id())
            .select((occ_locks::label, occ_locks::expires_at))
    }

    /// Whose the lock is now.
    pub(crate) fn owner_read(&self) -> LockOwner {
        occ_locks::table.find(self.id()).select((
            occ_locks::holder,
            occ_locks::label,
            occ_locks::fence,
        ))
    }
}

/// Taking the lock on `key` for `holder` for `ttl`, if it is free or its lease ended.
pub(crate) fn acquire_statement(
    key: &LockKey,
    holder: &str,
    label: Option<&str>,
    ttl: Duration,
) -> AcquireLock {
    AcquireLock::new(
        occ_locks::table,
        Joined(
            Joined(
                Joined(
                    ColumnEq::new(holder.to_string()),
                    ColumnEq::new(label.map(str::to_string)),
                    Comma,
                ),
                Joined(NextFence::default(), Increment::default(), Comma),
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
        // A held row without an expiry (written by hand) would block its lock for ever: it
        // counts as expired.
        Either(
            Null::test(),
            Either(Null::test(), ClockColumn::before(Shift::none())),
        ),
    )
}

/// Extending `holder`'s unexpired lease on `key` to `ttl` from now.
pub(crate) fn renew_statement(key: &LockKey, holder: &str, fence: i64, ttl: Duration) -> RenewLock {
    RenewLock::new(
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
    )
}

/// Freeing the lock on `key` if `holder` still holds it with `fence`.
pub(crate) fn release_statement(key: &LockKey, holder: &str, fence: i64) -> ReleaseLock {
    ReleaseLock::new(
        occ_locks::table,
        Joined(Joined(Null::set(), Null::set(), Comma), Null::set(), Comma),
        Unguarded,
        key.predicate(),
        held_by(holder, fence),
    )
}

/// A lock's `name/resource`, formatted only when shown.
pub(crate) struct ShownKey<'k>(&'k LockKey);

impl std::fmt::Display for ShownKey<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.0.name, self.0.resource)
    }
}

impl std::fmt::Debug for ShownKey<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// A lock's write, with what it needs beyond the lock's key and the holder.
#[derive(Debug, Clone, Copy)]
pub(crate) enum LockStep<'a> {
    /// Take the lock, labelled, for `ttl`.
    Acquire {
        label: Option<&'a str>,
        ttl: Duration,
    },
    /// Extend the lease of the grant with `fence` to `ttl` from now.
    Renew { fence: i64, ttl: Duration },
    /// Free the lock granted with `fence`.
    Release { fence: i64 },
}

impl LockStep<'_> {
    /// The step's name in the telemetry (`db.operation`).
    pub(crate) fn operation(&self) -> &'static str {
        match self {
            LockStep::Acquire { .. } => "lock.acquire",
            LockStep::Renew { .. } => "lock.renew",
            LockStep::Release { .. } => "lock.release",
        }
    }

    /// Reports what the step answered: a grant, a lock held by another, a loss, a release.
    pub(crate) fn report(&self, key: &LockKey, answer: &Result<i64, Error>) {
        use crate::telemetry as t;
        match (self, answer) {
            (LockStep::Acquire { ttl, .. }, Ok(fence)) => t::lock_granted(key, *fence, *ttl),
            (LockStep::Release { fence }, Ok(_)) => t::lock_released(key, *fence),
            (_, Err(Error::LockHeld { holder, until, .. })) => {
                t::lock_busy(key, holder.as_deref(), until.as_deref())
            }
            // A loss is reported where the holder's belief is known, once per grant
            // ([`report_loss`]).
            _ => {}
        }
    }

    /// Which write this is, for the flow that orders its statements.
    pub(crate) fn write(&self) -> LockWrite {
        match self {
            LockStep::Acquire { .. } => LockWrite::Acquire,
            LockStep::Renew { .. } => LockWrite::Renew,
            LockStep::Release { .. } => LockWrite::Release,
        }
    }
}

/// The compare-and-set that takes the lock; a miss names who holds it.
pub(crate) fn acquire_write<'k>(
    key: &'k LockKey,
    holder: &str,
    label: Option<&str>,
    ttl: Duration,
) -> CompareAndSet<'k, AcquireLock, LockTaken<'k>> {
    let statement = acquire_statement(key, holder, label, ttl);
    CompareAndSet::one(statement, "occ_locks", key, LockTaken { key })
}

/// The compare-and-set that extends the holder's lease; a miss says why it was lost.
pub(crate) fn renew_write<'k>(
    key: &'k LockKey,
    holder: &'k str,
    fence: i64,
    ttl: Duration,
) -> CompareAndSet<'k, RenewLock, LeaseLost<'k>> {
    let statement = renew_statement(key, holder, fence, ttl);
    CompareAndSet::one(
        statement,
        "occ_locks",
        key,
        LeaseLost { key, holder, fence },
    )
}

/// The compare-and-set that frees the holder's lock; a miss says why it was lost.
pub(crate) fn release_write<'k>(
    key: &'k LockKey,
    holder: &'k str,
    fence: i64,
) -> CompareAndSet<'k, ReleaseLock, LeaseLost<'k>> {
    let statement = release_statement(key, holder, fence);
    CompareAndSet::one(
        statement,
        "occ_locks",
        key,
        LeaseLost { key, holder, fence },
    )
}

/// The insert of the lock row unless it exists: it cannot miss.
pub(crate) fn create_write(key: &LockKey) -> CompareAndSet<'_, CreateLock, CannotMiss> {
    CompareAndSet::one(key.create_row(), "occ_locks", key, CannotMiss).matching(Matches::Any)
}

/// A grant whose fence was not read back: the backend's read-back is broken.
pub(crate) fn fence_not_read_back() -> Error {
    Error::Database(diesel::result::Error::QueryBuilderError(
        "the lock was taken but its fence was not read back".into(),
    ))
}

/// `lock_name = ? AND resource = ?`.
type KeyOf =
    Joined<ColumnEq<occ_locks::lock_name, String>, ColumnEq<occ_locks::resource, String>, And>;

/// `holder = ? AND fence = ?`: the lock is still this holder's.
type HeldBy = Joined<ColumnEq<occ_locks::holder, String>, ColumnEq<occ_locks::fence, i64>, And>;

/// A statement on one lock row: `UPDATE occ_locks SET <Set> WHERE <key> AND <Guard>`.
type LockUpdate<Set, Guard> = GuardedUpdate<occ_locks::table, Set, Unguarded, KeyOf, Guard>;

/// Taking the lock: `SET holder = ?, label = ?, fence = GREATEST(fence + 1, <next fence>),
/// holder_changes =
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
            Joined<NextFence<occ_locks::fence>, Increment<occ_locks::holder_changes>, Comma>,
            Comma,
        >,
        Joined<
            Joined<LockClock<occ_locks::acquired_at>, LockClock<occ_locks::renewed_at>, Comma>,
            LockClock<occ_locks::expires_at>,
            Comma,
        >,
        Comma,
    >,
    Either<
        Null<occ_locks::holder>,
        Either<Null<occ_locks::expires_at>, LockClock<occ_locks::expires_at>>,
    >,
>;

/// Renewing the lease: `SET renewed_at = now, expires_at = now + ttl WHERE <key> AND
/// holder = ? AND fence = ? AND expires_at >= now`.
pub(crate) type RenewLock = LockUpdate<
    Joined<LockClock<occ_locks::renewed_at>, LockClock<occ_locks::expires_at>, Comma>,
    Joined<HeldBy, LockClock<occ_locks::expires_at>, And>,
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

/// `SELECT holder, label, fence FROM occ_locks WHERE <key>`: whose the lock is now.
pub(crate) type LockOwner = Select<
    Find<occ_locks::table, (String, String)>,
    (occ_locks::holder, occ_locks::label, occ_locks::fence),
>;

/// `SELECT fence FROM occ_locks WHERE <key> FOR UPDATE`: the row locked for the statement
/// that follows, so that it does not wait.
pub(crate) type LockRow =
    LatestRead<Select<Find<occ_locks::table, (String, String)>, occ_locks::fence>>;

/// `SELECT fence FROM occ_locks WHERE <key> AND holder = ? AND fence = ? AND expires_at
/// >= now FOR UPDATE`: the lock is still this holder's, by the database's clock.
pub(crate) type HeldRow = LatestRead<
    ColumnOfRow<
        occ_locks::table,
        Joined<Joined<KeyOf, HeldBy, And>, LockClock<occ_locks::expires_at>, And>,
        occ_locks::fence,
    >,
>;

/// A connection locks can run on: the three statements of a lock, written once for every
/// connection whose backend they fit. Not a trait to implement.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a diesel connection the blocking locks run on",
    note = "on a diesel-async connection, use `diesel_occ::asynchronous::AsyncLocks`, and for a write that commits only while the lock is held `AsyncLockGuard::write_while_held` or `Held::write_while_held_async`"
)]
pub trait LockConnection {
    /// Takes the lock for `holder` if it is free or expired; its new fence. No statement
    /// waits longer than `wait`.
    #[doc(hidden)]
    fn acquire_lock(
        &mut self,
        key: &LockKey,
        holder: &str,
        label: Option<&str>,
        ttl: Duration,
        wait: Duration,
    ) -> Result<i64, Error>;

    /// Extends `holder`'s unexpired lease to `ttl` from now.
    #[doc(hidden)]
    fn renew_lock(
        &mut self,
        key: &LockKey,
        holder: &str,
        fence: i64,
        ttl: Duration,
        wait: Duration,
    ) -> Result<(), Error>;

    /// Inside the caller's open transaction: [`Error::LockLost`] unless `holder` still
    /// holds the lock with `fence` and an unexpired lease by the database's clock. The lock
    /// row stays locked until that transaction ends, so nobody takes the lock over before
    /// it commits.
    #[doc(hidden)]
    fn check_held(&mut self, key: &LockKey, holder: &str, fence: i64) -> Result<(), Error>;

    /// Frees the lock if `holder` still holds it with `fence`.
    #[doc(hidden)]
    fn release_lock(
        &mut self,
        key: &LockKey,
        holder: &str,
        fence: i64,
        wait: Duration,
    ) -> Result<(), Error>;
}

impl<C> LockConnection for C
where
    C: LoadConnection + WriteTransaction + SimpleConnection + Send,
    C::Backend: LockBackend,
    AcquireLock: Assignments<C::Backend>,
    RenewLock: Assignments<C::Backend>,
    ReleaseLock: Assignments<C::Backend>,
    CreateLock: Assignments<C::Backend> + ExecuteDsl<C>,
    ReturnedBy<occ_locks::fence>: Complete<C, AcquireLock, i64>,
    Counted: Complete<C, RenewLock, i64> + Complete<C, ReleaseLock, i64>,
    LockHolder: LoadQuery<'static, C, (Option<String>, Option<chrono::NaiveDateTime>)>,
    LockOwner: LoadQuery<'static, C, (Option<String>, Option<String>, i64)>,
    LockRow: LoadQuery<'static, C, i64>,
    HeldRow: LoadQuery<'static, C, i64>,
{
    fn acquire_lock(
        &mut self,
        key: &LockKey,
        holder: &str,
        label: Option<&str>,
        ttl: Duration,
        wait: Duration,
    ) -> Result<i64, Error> {
        let step = LockStep::Acquire { label, ttl };
        now(write_lock(Blocking::wrap(self), key, holder, step, wait))
    }

    fn renew_lock(
        &mut self,
        key: &LockKey,
        holder: &str,
        fence: i64,
        ttl: Duration,
        wait: Duration,
    ) -> Result<(), Error> {
        let step = LockStep::Renew { fence, ttl };
        now(write_lock(Blocking::wrap(self), key, holder, step, wait)).map(drop)
    }

    fn check_held(&mut self, key: &LockKey, holder: &str, fence: i64) -> Result<(), Error> {
        now(check_held(Blocking::wrap(self), key, holder, fence))
    }

    fn release_lock(
        &mut self,
        key: &LockKey,
        holder: &str,
        fence: i64,
        wait: Duration,
    ) -> Result<(), Error> {
        let step = LockStep::Release { fence };
        now(write_lock(Blocking::wrap(self), key, holder, step, wait)).map(drop)
    }
}

/// Judges a grant's read-back: a grant the row does not show never happened, and the
/// attempt is [`Error::Retryable`], as the server rolled its transaction back.
pub(crate) fn grant_in_row(
    key: &LockKey,
    holder: &str,
    fence: i64,
    row: Option<(Option<String>, Option<String>, i64)>,
) -> Result<(), Error> {
    match row {
        Some((Some(owner), _, in_row)) if owner == holder && in_row == fence => Ok(()),
        other => Err(Error::Retryable {
            reason: crate::RetryReason::SerializationFailure,
            source: diesel::result::Error::DatabaseError(
                diesel::result::DatabaseErrorKind::SerializationFailure,
                Box::new(format!(
                    "the grant of {} with fence {fence} was not in its row after its COMMIT \
                     (the row: {}): the server had rolled it back",
                    key.describe(),
                    match other {
                        Some((_, _, in_row)) => format!("fence {in_row}, another holder or none"),
                        None => "missing".into(),
                    }
                )),
            ),
        }),
    }
}

/// `holder = ? AND fence = ?`.
fn held_by(holder: &str, fence: i64) -> HeldBy {
    Joined(ColumnEq::new(holder.to_string()), ColumnEq::new(fence), And)
}

/// Locks taken with connections from a pool.
pub struct Locks<S: ConnectionSource> {
    pool: S,
}

impl<S: ConnectionSource> Clone for Locks<S> {
    fn clone(&self) -> Self {
        Locks {
            pool: self.pool.clone(),
        }
    }
}

/// How long one statement of a lock may wait: a third of the lease, and never past the
/// local deadline of the belief it serves (at least a millisecond).
pub(crate) fn wait_bound(ttl: Duration, remaining: Duration) -> Duration {
    (ttl / 3).min(remaining).max(Duration::from_millis(1))
}

/// [`Error::LockLost`] when `belief` ended before a renewal of `key` could be sent.
pub(crate) fn renewable(key: &LockKey, belief: &Belief) -> Result<(), Error> {
    if belief.is_held() {
        return Ok(());
    }
    let why = "its local deadline passed before this renewal was sent";
    report_loss(key, belief, why);
    Err(Error::LockLost {
        lock: key.describe(),
        why: why.into(),
    })
}

/// What the answer `renewed` to a renewal of `key` sent at `start` means for `belief`: the
/// belief moves on from `start`; [`Error::LockLost`] when the lease ended or was taken over,
/// or when the belief's deadline passed before the answer came (then the belief stays
/// ended even if the database renewed: the holder may already have been told it lost).
/// Other errors leave the belief as it was, to its deadline.
pub(crate) fn judge_renewal(
    key: &LockKey,
    belief: &Belief,
    start: Instant,
    renewed: Result<(), Error>,
) -> Result<(), Error> {
    match renewed {
        Ok(()) if belief.extend(start) => Ok(()),
        Ok(()) => {
            belief.end();
            let why = "the renewal came back after the holder's local deadline; it does not revive the lease";
            report_loss(key, belief, why);
            Err(Error::LockLost {
                lock: key.describe(),
                why: why.into(),
            })
        }
        Err(Error::LockLost { lock, why }) => {
            belief.end();
            report_loss(key, belief, &why);
            Err(Error::LockLost { lock, why })
        }
        Err(e) => Err(e),
    }
}

/// Reports the loss of the grant of `key` that `belief` holds, for reason `why`, unless
/// it was reported already (a renewal, the keep-alive and the release may each find it).
pub(crate) fn report_loss(key: &LockKey, belief: &Belief, why: &str) {
    if belief.first_loss_report() {
        crate::telemetry::lock_lost(key, why);
    }
}

/// Reports what a release answered: a loss not reported before.
pub(crate) fn report_release(hold: &Hold, released: &Result<(), Error>) {
    if let Err(Error::LockLost { why, .. }) = released {
        report_loss(&hold.key, &hold.belief, why);
    }
}

/// A request for a lock, checked: its key, the new holder's token and how long the grant
/// is believed (`length`, at most the lease less the safety margin).
pub(crate) struct LockRequest {
    pub(crate) key: LockKey,
    pub(crate) holder: String,
    pub(crate) length: Duration,
}

impl LockRequest {
    /// Checks the names, label and lease, and draws a holder token.
    pub(crate) fn new(
        name: &str,
        resource: &str,
        ttl: Duration,
        label: Option<&str>,
        length: Duration,
    ) -> Result<Self, Error> {
        check_name("lock name", name)?;
        check_name("resource", resource)?;
        if let Some(label) = label {
            check_name("label", label)?;
        }
        check_ttl(ttl)?;
        Ok(LockRequest {
            key: LockKey {
                name: name.to_string(),
                resource: resource.to_string(),
            },
            holder: holder_token()?,
            length: length.min(believed(ttl)),
        })
    }
}

/// [`Error::LockLost`] for a grant of `lock` that came back after its local deadline.
pub(crate) fn late_grant(lock: String) -> Error {
    Error::LockLost {
        lock,
        why: "the grant came back after the holder's local deadline".into(),
    }
}

/// One holder's hold on a lock: which lock, the holder's token and fence, the lease each
/// renewal grants, and the holder's belief in it. Shared by the blocking and async
/// renewals.
#[derive(Debug, Clone)]
pub(crate) struct Hold {
    pub(crate) key: LockKey,
    pub(crate) holder: String,
    pub(crate) fence: i64,
    pub(crate) ttl: Duration,
    pub(crate) belief: Arc<Belief>,
}

impl Hold {
    /// The hold of a grant of `request` with `fence`, requested at `start`.
    pub(crate) fn granted(request: LockRequest, fence: i64, ttl: Duration, start: Instant) -> Self {
        Hold {
            key: request.key,
            holder: request.holder,
            fence,
            ttl,
            belief: Arc::new(Belief::new(start, request.length)),
        }
    }

    /// Whether this process may still act as the holder.
    pub(crate) fn is_held(&self) -> bool {
        self.belief.is_held()
    }

    /// The local deadline; `None` once the lease was lost or released.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.belief.deadline()
    }

    /// The belief a renewal extends.
    pub(crate) fn belief(&self) -> Arc<Belief> {
        Arc::clone(&self.belief)
    }

    /// The hold as the protected work sees it, stopped by `loss`.
    pub(crate) fn held(&self, loss: Arc<Loss>) -> Held {
        Held::new(
            self.key.clone(),
            self.holder.clone(),
            self.fence,
            self.belief(),
            loss,
        )
    }

    /// Ends the belief for good.
    pub(crate) fn end(&self) {
        self.belief.end();
    }

    /// The lock's name and resource.
    pub(crate) fn describe(&self) -> String {
        self.key.describe()
    }

    /// How long a renewal's statements may wait: never past the local deadline.
    pub(crate) fn renewal_wait(&self) -> Duration {
        wait_bound(self.ttl, self.belief.remaining())
    }

    /// How long a release's statements may wait.
    pub(crate) fn release_wait(&self) -> Duration {
        wait_bound(self.ttl, self.ttl)
    }
}

/// Renewing one holder's lease, on connections of its own from the pool: what a
/// [`LockGuard`] does, and what a keep-alive thread does for it.
pub(crate) struct Renewal<S: ConnectionSource> {
    pool: S,
    hold: Hold,
}

impl<S: ConnectionSource> Clone for Renewal<S> {
    fn clone(&self) -> Self {
        Renewal {
            pool: self.pool.clone(),
            hold: self.hold.clone(),
        }
    }
}

impl<S: ConnectionSource> std::ops::Deref for Renewal<S> {
    type Target = Hold;

    fn deref(&self) -> &Hold {
        &self.hold
    }
}

impl<S: ConnectionSource> Renewal<S>
where
    S::Connection: LockConnection,
{
    /// Extends the lease to `ttl` from now (database clock) and the belief from before the
    /// request, as [`judge_renewal`] says.
    pub(crate) fn renew(&self) -> Result<(), Error> {
        let start = Instant::now();
        let hold = &self.hold;
        renewable(&hold.key, &hold.belief)?;
        let renewed = self.pool.on_connection(|conn| {
            conn.renew_lock(
                &hold.key,
                &hold.holder,
                hold.fence,
                hold.ttl,
                hold.renewal_wait(),
            )
        })?;
        judge_renewal(&hold.key, &hold.belief, start, renewed)
    }
}

/// A lock held: its fencing token, whether this process may still act as its holder, and
/// renew and release. Dropping it releases it, best effort.
pub struct LockGuard<S: ConnectionSource>
where
    S::Connection: LockConnection,
{
    renewal: Renewal<S>,
    released: bool,
}

impl<S: ConnectionSource> Locks<S>
where
    S::Connection: LockConnection,
{
    /// Locks whose statements run on connections from `pool`: an r2d2 pool, a
    /// deadpool-diesel one (feature `deadpool`), any [`ConnectionSource`].
    pub fn new(pool: S) -> Self {
        Locks { pool }
    }

    /// Takes the lock `(name, resource)` for `ttl` if it is free or its lease ended, else
    /// [`Error::LockHeld`] with its holder's label and the end of its lease. `label` names
    /// the holder for people (a host and process), never for the check.
    ///
    /// The attempt waits at most a third of `ttl` for the lock row (held by a long
    /// transaction, a backup, someone's `SELECT ... FOR UPDATE`): then it fails with
    /// [`Error::Retryable`]. A grant that comes back after the guard's local deadline
    /// (this process paused, say) is [`Error::LockLost`], and the lock is released.
    pub fn try_lock(
        &self,
        name: &str,
        resource: &str,
        ttl: Duration,
        label: Option<&str>,
    ) -> Result<LockGuard<S>, Error> {
        self.acquire(name, resource, ttl, label, believed(ttl))
    }

    /// [`try_lock`](Self::try_lock), believed for `length` from before the request
    /// (at most the lease less the safety margin).
    pub(crate) fn acquire(
        &self,
        name: &str,
        resource: &str,
        ttl: Duration,
        label: Option<&str>,
        length: Duration,
    ) -> Result<LockGuard<S>, Error> {
        let request = LockRequest::new(name, resource, ttl, label, length)?;
        let start = Instant::now();
        let fence = self.pool.on_connection(|conn| {
            let wait = wait_bound(ttl, request.length.saturating_sub(start.elapsed()));
            conn.acquire_lock(&request.key, &request.holder, label, ttl, wait)
        })??;
        let guard = LockGuard {
            renewal: Renewal {
                pool: self.pool.clone(),
                hold: Hold::granted(request, fence, ttl, start),
            },
            released: false,
        };
        if !guard.is_held() {
            let lock = guard.describe();
            // Freed on drop, best effort.
            drop(guard);
            return Err(late_grant(lock));
        }
        Ok(guard)
    }

    /// [`try_lock`](Self::try_lock), trying again while the lock is held, the database
    /// refuses for now ([`Error::Retryable`]) or a grant came back too late to be believed
    /// ([`Error::LockLost`]; it is released at once, best effort: a release that fails
    /// leaves the lock held until that lease ends), for at most `wait`, with waits drawn as
    /// `policy` draws them. The last such error when the wait is over.
    pub fn lock(
        &self,
        name: &str,
        resource: &str,
        ttl: Duration,
        label: Option<&str>,
        wait: Duration,
        policy: &RetryPolicy,
    ) -> Result<LockGuard<S>, Error> {
        policy.poll(wait, is_worth_waiting_on, || {
            self.try_lock(name, resource, ttl, label)
        })
    }

    /// [`lock`](Self::lock) for async code (feature `tokio`): each try runs on tokio's
    /// blocking pool and the waits between tries sleep on its timer, so a request waiting
    /// for a lock holds no thread. Dropping the future (a timeout, a client gone) stops
    /// the waiting; a try already running finishes on the blocking pool, and a lock it
    /// took is released there at once, since nobody will receive its guard.
    #[cfg(feature = "tokio")]
    pub async fn lock_async(
        &self,
        name: &str,
        resource: &str,
        ttl: Duration,
        label: Option<&str>,
        wait: Duration,
        policy: &RetryPolicy,
    ) -> Result<LockGuard<S>, Error> {
        policy
            .poll_async(wait, is_worth_waiting_on, || {
                let (locks, name, resource) =
                    (self.clone(), name.to_string(), resource.to_string());
                let label = label.map(str::to_string);
                async move {
                    let tried = tokio::task::spawn_blocking(move || {
                        locks.try_lock(&name, &resource, ttl, label.as_deref())
                    });
                    match tried.await {
                        Ok(outcome) => outcome,
                        Err(join) if join.is_panic() => {
                            std::panic::resume_unwind(join.into_panic())
                        }
                        Err(join) => Err(Error::InvalidSetting {
                            what: "async runtime",
                            reason: format!("the lock attempt did not run: {join}"),
                        }),
                    }
                }
            })
            .await
    }
}

/// Whether a refused try is worth waiting on: held, refused for now by the database (a
/// serialization failure under REPEATABLE READ or SERIALIZABLE sessions, a deadlock,
/// SQLite busy, a row lock held past the wait bound), or granted too late to be believed
/// (and released, best effort).
pub(crate) fn is_worth_waiting_on(error: &Error) -> bool {
    matches!(
        error,
        Error::LockHeld { .. } | Error::Retryable { .. } | Error::LockLost { .. }
    )
}

impl<S: ConnectionSource> LockGuard<S>
where
    S::Connection: LockConnection,
{
    /// The fencing token of this acquisition: larger than every earlier holder's.
    pub fn fence(&self) -> i64 {
        self.renewal.fence
    }

    /// This holder's random token.
    pub fn holder(&self) -> &str {
        &self.renewal.holder
    }

    /// The lease each renewal grants.
    pub fn ttl(&self) -> Duration {
        self.renewal.ttl
    }

    /// The lock's name and resource, for messages.
    pub fn describe(&self) -> String {
        self.renewal.describe()
    }

    /// Whether this process may still act as the lock's holder: `false` from the local
    /// deadline on, or once a renewal found the lock lost. No round trip: check it before
    /// each step of the protected work (and fence its writes, since a check cannot stop a
    /// write that a pause delays past it).
    pub fn is_held(&self) -> bool {
        self.renewal.is_held()
    }

    /// The local deadline, on this process's monotonic clock: the instant before the last
    /// successful grant or renewal was requested, plus the lease, less the safety margin
    /// ([`SAFETY_MARGIN`](crate::SAFETY_MARGIN)). The database's lease ends later. `None`
    /// once the lock was lost or released.
    pub fn deadline(&self) -> Option<Instant> {
        self.renewal.deadline()
    }

    /// Runs `write` in a transaction that commits only while this guard still holds the
    /// lock by the database's clock ([`Held::write_while_held`]), for tables without a
    /// fence column. [`Error::LockLost`] (and nothing written) once it does not; see the
    /// locks guide for an example.
    pub fn write_while_held<C, T, E>(
        &self,
        conn: &mut C,
        write: impl FnOnce(&mut C) -> Result<T, E>,
    ) -> Result<T, E>
    where
        C: LockConnection + WriteTransaction,
        E: From<Error>,
    {
        self.renewal.held(Loss::new()).write_while_held(conn, write)
    }

    /// The renewal of this lease, for another thread.
    pub(crate) fn renewal(&self) -> Renewal<S> {
        self.renewal.clone()
    }

    /// Extends the lease to `ttl` from now (database clock). [`Error::LockLost`] when the
    /// lease already ended, another holder took the lock, or the local deadline passed
    /// before the answer came: stop the work it protects. It waits at most until the
    /// local deadline; other errors (the database unreachable, the row lock held past that)
    /// leave the lease to its deadline, and a later renewal may still succeed.
    pub fn renew(&mut self) -> Result<(), Error> {
        self.renewal.renew()
    }

    /// Frees the lock, keeping its row. [`Error::LockLost`] when another holder took it
    /// over meanwhile.
    ///
    /// When the release fails otherwise (its connection died: [`Error::Retryable`] with
    /// [`RetryReason::ConnectionLost`](crate::RetryReason::ConnectionLost) before its
    /// `COMMIT`, [`Error::Ambiguous`] at it; no pooled connection, ...), the guard's drop tries once more on another connection,
    /// as it does for a guard that was never released, so a lost connection does not keep
    /// the lock held until its lease ends. Releasing twice is harmless: the owner check
    /// makes the second one match nothing.
    pub fn release(mut self) -> Result<(), Error> {
        let result = self.free();
        self.released = !matches!(&result, Err(e) if !matches!(e, Error::LockLost { .. }));
        result
    }

    fn free(&self) -> Result<(), Error> {
        let renewal = &self.renewal;
        renewal.end();
        let released = renewal.pool.on_connection(|conn| {
            conn.release_lock(
                &renewal.key,
                &renewal.holder,
                renewal.fence,
                renewal.release_wait(),
            )
        })?;
        report_release(renewal, &released);
        released
    }
}

impl<S: ConnectionSource> std::fmt::Debug for Locks<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Locks").finish_non_exhaustive()
    }
}

impl<S: ConnectionSource> std::fmt::Debug for LockGuard<S>
where
    S::Connection: LockConnection,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("lock", &self.describe())
            .field("fence", &self.fence())
            .field("ttl", &self.ttl())
            .field("held", &self.is_held())
            .field("released", &self.released)
            .finish_non_exhaustive()
    }
}

impl<S: ConnectionSource> Drop for LockGuard<S>
where
    S::Connection: LockConnection,
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
pub(crate) struct LockTaken<'k> {
    pub(crate) key: &'k LockKey,
}

impl<C> Miss<C> for LockTaken<'_>
where
    C: LoadConnection,
    C::Backend: LockBackend,
    LockHolder: LoadQuery<'static, C, (Option<String>, Option<chrono::NaiveDateTime>)>,
{
    fn explain(self, conn: &mut C) -> Error {
        match self.key.holder_read().get_result(conn).optional() {
            Ok(row) => self.given(row),
            Err(e) => classify(conn, e),
        }
    }
}

impl LockTaken<'_> {
    /// [`Error::LockHeld`], given the lock row's holder label and expiry.
    pub(crate) fn given(
        self,
        row: Option<(Option<String>, Option<chrono::NaiveDateTime>)>,
    ) -> Error {
        let (holder, until) = row.unwrap_or((None, None));
        Error::LockHeld {
            lock: self.key.describe(),
            holder,
            until: until.map(|t| t.format("%Y-%m-%d %H:%M:%S%.6f UTC").to_string()),
        }
    }
}

/// A renewal or release matched nothing: the lease ended, or another holder took the
/// lock ([`Error::LockLost`], naming who holds it now, read from the row).
pub(crate) struct LeaseLost<'k> {
    pub(crate) key: &'k LockKey,
    pub(crate) holder: &'k str,
    pub(crate) fence: i64,
}

impl<C> Miss<C> for LeaseLost<'_>
where
    C: LoadConnection,
    C::Backend: LockBackend,
    LockOwner: LoadQuery<'static, C, (Option<String>, Option<String>, i64)>,
{
    fn explain(self, conn: &mut C) -> Error {
        match self.key.owner_read().get_result(conn).optional() {
            Ok(row) => self.given(row),
            Err(e) => classify(conn, e),
        }
    }
}

impl LeaseLost<'_> {
    /// [`Error::LockLost`], given the lock row's holder, label and fence now.
    pub(crate) fn given(self, row: Option<(Option<String>, Option<String>, i64)>) -> Error {
        let why = match row {
            None => "its row was deleted".to_string(),
            Some((Some(holder), _, fence)) if holder == self.holder && fence == self.fence => {
                "its lease ended".to_string()
            }
            Some((None, _, fence)) if fence == self.fence => "it was released".to_string(),
            Some((None, _, fence)) => {
                format!("its lease ended; another holder took it (fence {fence}) and released it")
            }
            Some((Some(_), label, fence)) => format!(
                "its lease ended and {} holds it now, with fence {fence}",
                label.as_deref().unwrap_or("another holder")
            ),
        };
        Error::LockLost {
            lock: self.key.describe(),
            why,
        }
    }
}

/// A lease must be at least a millisecond (SQLite's clock) and at most [`MAX_TTL`].
pub(crate) fn check_ttl(ttl: Duration) -> Result<(), Error> {
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

#[cfg(all(test, feature = "postgres"))]
mod tests {
    use super::*;
    use diesel::pg::Pg;

    /// On PostgreSQL every statement of a lock writes and compares its times as instants,
    /// which no session's time zone moves: no naive UTC expression is left against them.
    #[test]
    fn lock_times_are_instants_on_postgres() {
        let key = LockKey {
            name: "report".into(),
            resource: "main".into(),
        };
        let ttl = Duration::from_secs(5);
        let statements = [
            diesel::debug_query::<Pg, _>(&acquire_statement(&key, "h", None, ttl)).to_string(),
            diesel::debug_query::<Pg, _>(&renew_statement(&key, "h", 7, ttl)).to_string(),
            diesel::debug_query::<Pg, _>(&key.held_row("h", 7)).to_string(),
        ];
        for sql in statements {
            assert!(sql.contains("(clock_timestamp() + "), "{sql}");
            assert!(!sql.contains("AT TIME ZONE"), "{sql}");
        }
    }
}
