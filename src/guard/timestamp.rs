//! The last-modified guard (`#[occ(last_modified)]`): a timestamp column is the token.
//!
//! `last_modified = ?read` proves the row, `last_modified = ?next` advances it. The next
//! timestamp always moves past the old one, by at least one tick of the column's
//! precision, even when the clock has not moved since (two writes in one tick) or went
//! back (an NTP step, another machine's clock): a timestamp that stood still would let a
//! stale copy win. It is computed in Rust from a [`Clock`] and bound, so the caller learns
//! the new token without reading the row back, and comparisons are exact on every
//! backend: PostgreSQL and MySQL `DATETIME(6)` keep microseconds, SQLite keeps the text
//! diesel writes (one canonical form per instant), and a column that keeps less
//! (MySQL `DATETIME`, whole seconds) declares it with `precision = "seconds"`.
//!
//! The clock is the application's ([`Clock`]). The database's clock can be chosen
//! instead, `#[occ(last_modified(clock = database))]`; see the `database_clock`
//! module.

use std::fmt::Debug;
use std::marker::PhantomData;

use chrono::{DateTime, NaiveDateTime, TimeDelta, Utc};
use diesel::sql_types::is_nullable::NotNull;
use diesel::sql_types::SqlType;
use diesel::Column;

use crate::error::Token;
use crate::guard::server_clock::TimestampPast;
use crate::guard::stored_precision::TimeTokenHeld;
use crate::guard::{AdvanceInSql, Advancing, GuardKind};
use crate::sql::statement::{ColumnEq, Unguarded};

/// Where "now" comes from. [`SystemClock`] unless the field names another with
/// `#[occ(last_modified(clock = path::To::Clock))]` (a test's frozen clock, say).
pub trait Clock {
    /// The current instant.
    fn now() -> DateTime<Utc>;
}

/// The application's clock: [`Utc::now`].
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now() -> DateTime<Utc> {
        Utc::now()
    }
}

/// How finely a timestamp column keeps time; the tick a write advances by at least.
pub trait Precision {
    /// One tick, in microseconds.
    const TICK_MICROS: i64;
    /// The unit's name for PostgreSQL's `date_trunc` and `interval`.
    const UNIT: &'static str;
    /// Digits after the seconds' point (MySQL's fractional seconds precision).
    const DIGITS: u32;
}

/// Microseconds (PostgreSQL, MySQL `DATETIME(6)`, SQLite as diesel writes it): the default.
#[derive(Debug, Clone, Copy, Default)]
pub struct Micros;

/// Milliseconds (`DATETIME(3)`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Millis;

/// Whole seconds (MySQL `DATETIME` / `TIMESTAMP` without fractional digits).
#[derive(Debug, Clone, Copy, Default)]
pub struct Seconds;

impl Precision for Micros {
    const TICK_MICROS: i64 = 1;
    const UNIT: &'static str = "microsecond";
    const DIGITS: u32 = 6;
}

impl Precision for Millis {
    const TICK_MICROS: i64 = 1_000;
    const UNIT: &'static str = "millisecond";
    const DIGITS: u32 = 3;
}

impl Precision for Seconds {
    const TICK_MICROS: i64 = 1_000_000;
    const UNIT: &'static str = "second";
    const DIGITS: u32 = 0;
}

/// The Rust types a last-modified column may be read into.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a last-modified token: use `chrono::NaiveDateTime` or `chrono::DateTime<Utc>`",
    label = "not a timestamp type"
)]
pub trait Timestamp: Copy + Debug + PartialEq + Send + Sync + 'static {
    /// Whether the column holds an instant with its zone (`timestamptz`) rather than UTC
    /// without one, for the database clock's SQL.
    const ZONED: bool;
    /// This instant as UTC.
    fn to_utc(self) -> DateTime<Utc>;
    /// The instant as this type.
    fn from_utc(utc: DateTime<Utc>) -> Self;
}

impl Timestamp for NaiveDateTime {
    const ZONED: bool = false;
    fn to_utc(self) -> DateTime<Utc> {
        self.and_utc()
    }
    fn from_utc(utc: DateTime<Utc>) -> Self {
        utc.naive_utc()
    }
}

impl Timestamp for DateTime<Utc> {
    const ZONED: bool = true;
    fn to_utc(self) -> DateTime<Utc> {
        self
    }
    fn from_utc(utc: DateTime<Utc>) -> Self {
        utc
    }
}

/// The timestamp after `old`: now (from `K`) cut to precision `P`, but at least one tick
/// past `old` cut to `P`. `None` past the last representable instant.
pub(crate) fn next_timestamp<Ts: Timestamp, K: Clock, P: Precision>(old: Ts) -> Option<Ts> {
    let now = Ts::from_utc(truncate::<P>(K::now())?);
    let floor = one_tick_past::<Ts, P>(old)?;
    Some(if now.to_utc() > floor.to_utc() {
        now
    } else {
        floor
    })
}

/// `old` cut to precision `P`, plus one tick: the earliest timestamp a write after `old`
/// may set. `None` past the last representable instant.
pub(crate) fn one_tick_past<Ts: Timestamp, P: Precision>(old: Ts) -> Option<Ts> {
    let tick = TimeDelta::microseconds(P::TICK_MICROS);
    truncate::<P>(old.to_utc())?
        .checked_add_signed(tick)
        .map(Ts::from_utc)
}

/// Now (from `K`) cut to precision `P`: the value an `#[occ(updated_at)]` column gets.
pub fn stamp_now<Ts: Timestamp, K: Clock, P: Precision>() -> Ts {
    let now = K::now();
    Ts::from_utc(truncate::<P>(now).unwrap_or(now))
}

/// `instant` cut down to a whole number of `P` ticks.
fn truncate<P: Precision>(instant: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let micros = instant.timestamp_micros();
    DateTime::from_timestamp_micros(micros - micros.rem_euclid(P::TICK_MICROS))
}

/// The last-modified guard on column `Col` read as `Ts`, with clock `K` and precision `P`.
pub struct LastModifiedGuard<Col, Ts, K = SystemClock, P = Micros>(PhantomData<(Col, Ts, K, P)>);

impl<Col, Ts, K, P> GuardKind for LastModifiedGuard<Col, Ts, K, P>
where
    Col: Column,
    // A NULL token would disable the check: the column must be NOT NULL.
    Col::SqlType: SqlType<IsNull = NotNull>,
    Ts: Timestamp,
    K: Clock,
    P: Precision,
{
    type Token = Ts;
    type Predicate = TimeTokenHeld<Col, Ts, P>;
    type Advance = ColumnEq<Col, Ts>;
    type Completion = crate::sql::new_token::Counted;
    const TOKEN_DIGITS: Option<u32> = Some(P::DIGITS);

    fn predicate(token: &Ts) -> Self::Predicate {
        TimeTokenHeld::new(*token)
    }

    fn advance(token: &Ts) -> Option<(Self::Advance, Ts)> {
        next_timestamp::<Ts, K, P>(*token).map(|next| (ColumnEq::new(next), next))
    }

    fn describe(token: &Ts) -> Token {
        Token::Timestamp(
            token
                .to_utc()
                .format("%Y-%m-%d %H:%M:%S%.6f UTC")
                .to_string(),
        )
    }

    /// The library moves a row's timestamp only forward (the later of now and one tick
    /// past the row's own).
    fn precedes(found: &Ts, expected: &Ts) -> bool {
        found.to_utc() < expected.to_utc()
    }
}

impl<Col, Ts, K, P> Advancing for LastModifiedGuard<Col, Ts, K, P> where Self: GuardKind {}

/// The later of now (by clock `K`) and one tick past the row's own timestamp, computed by
/// the database; no row is left out.
impl<Col, Ts, K, P> AdvanceInSql for LastModifiedGuard<Col, Ts, K, P>
where
    Self: GuardKind<Token = Ts>,
    Col: Column,
    Ts: Timestamp,
    K: Clock,
    P: Precision,
{
    type AdvanceAny = TimestampPast<Col, Ts, P>;
    type CanAdvance = Unguarded;
    type TokenColumn = Col;
    type ReadBack = crate::sql::new_token::ReturnedBy<Col>;

    fn advance_any() -> Self::AdvanceAny {
        TimestampPast::caller(stamp_now::<Ts, K, P>())
    }

    fn can_advance() -> Unguarded {
        Unguarded
    }

    fn at_end(_: &Ts) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct At<const MICROS: i64>;

    impl<const MICROS: i64> Clock for At<MICROS> {
        fn now() -> DateTime<Utc> {
            DateTime::from_timestamp_micros(MICROS).unwrap()
        }
    }

    fn at(micros: i64) -> NaiveDateTime {
        DateTime::from_timestamp_micros(micros).unwrap().naive_utc()
    }

    #[test]
    fn next_is_now_when_the_clock_moved_on() {
        assert_eq!(
            next_timestamp::<_, At<5_000_000>, Micros>(at(1_000_000)),
            Some(at(5_000_000))
        );
    }

    #[test]
    fn next_moves_one_tick_when_the_clock_stood_still_or_went_back() {
        assert_eq!(
            next_timestamp::<_, At<1_000_000>, Micros>(at(1_000_000)),
            Some(at(1_000_001))
        );
        assert_eq!(
            next_timestamp::<_, At<0>, Micros>(at(1_000_000)),
            Some(at(1_000_001))
        );
        assert_eq!(
            next_timestamp::<_, At<1_000_000>, Seconds>(at(1_000_000)),
            Some(at(2_000_000))
        );
    }

    #[test]
    fn next_is_cut_to_the_precision_and_still_past_the_old_value() {
        // Now has microseconds a seconds column cannot keep; the old value has them too.
        assert_eq!(
            next_timestamp::<_, At<7_654_321>, Seconds>(at(1_500_000)),
            Some(at(7_000_000))
        );
        assert_eq!(
            next_timestamp::<_, At<1_900_000>, Seconds>(at(1_500_000)),
            Some(at(2_000_000))
        );
        assert_eq!(
            next_timestamp::<_, At<1_234_567>, Millis>(at(1_234_000)),
            Some(at(1_235_000))
        );
    }

    #[test]
    fn instants_before_1970_advance_too() {
        assert_eq!(
            next_timestamp::<_, At<-5_000_001>, Seconds>(at(-5_000_001)),
            Some(at(-5_000_000))
        );
    }

    #[test]
    fn the_last_instant_cannot_advance() {
        assert_eq!(next_timestamp::<_, At<0>, Micros>(NaiveDateTime::MAX), None);
    }
}
