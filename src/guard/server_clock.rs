//! The last-modified guard on the database's clock:
//! `#[occ(last_modified(clock = database))]`.
//!
//! The callers' clocks may disagree. With this clock, the next timestamp comes from the
//! server: `GREATEST(now cut to the precision, ?floor)`, where the floor is one tick past
//! the token the caller expects (the guard proves the row holds it, so the floor is
//! computed and bound by the caller). It still always moves on. How the caller learns it:
//!
//! - PostgreSQL: `clock_timestamp()` (unlike `now()`, not frozen at the transaction's
//!   start), handed back by the same statement with `RETURNING`.
//! - SQLite: `'now'` in the text form diesel writes (so that the next write's comparison
//!   is exact), handed back with `RETURNING`. SQLite's clock keeps milliseconds; a column
//!   of microseconds still advances by at least one tick.
//! - MySQL / MariaDB: `UTC_TIMESTAMP(<digits>)`. There is no `RETURNING`, so the write and a
//!   read of the column run in one transaction (a savepoint inside the caller's): four
//!   statements instead of one.

use std::marker::PhantomData;

use diesel::backend::Backend;
use diesel::query_builder::{AstPass, QueryFragment};
use diesel::serialize::ToSql;
use diesel::sql_types::is_nullable::NotNull;
use diesel::sql_types::{HasSqlType, SqlType};
use diesel::{Column, QueryResult};

use crate::error::Token;
use crate::guard::stored_precision::TimeTokenHeld;
use crate::guard::timestamp::{one_tick_past, Precision, Timestamp};
use crate::guard::{AdvanceInSql, Advancing, GuardKind};
use crate::sql::new_token::ReturnedBy;
use crate::sql::statement::Unguarded;

/// An offset from the database's now, for expiry times: in microseconds, and as SQLite's
/// date modifier (`'+1.500000 seconds'`).
#[derive(Debug, Clone)]
pub struct Shift {
    // Each backend reads the form it writes.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    micros: i64,
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    sqlite: String,
}

impl Shift {
    /// `duration` after now.
    pub fn later(duration: std::time::Duration) -> Self {
        Shift::new(duration, "+")
    }

    /// `duration` before now.
    pub fn earlier(duration: std::time::Duration) -> Self {
        Shift::new(duration, "-")
    }

    /// Now itself.
    pub fn none() -> Self {
        Shift::later(std::time::Duration::ZERO)
    }

    fn new(duration: std::time::Duration, sign: &str) -> Self {
        let micros = i64::try_from(duration.as_micros()).unwrap_or(i64::MAX);
        Shift {
            micros: if sign == "-" { -micros } else { micros },
            sqlite: format!(
                "{sign}{}.{:06} seconds",
                duration.as_secs(),
                duration.subsec_micros()
            ),
        }
    }
}

/// A backend's current instant, as SQL.
pub trait ServerClock: Backend {
    /// The function that picks the later of two timestamps.
    const GREATEST: &'static str;

    /// Pushes the server's current instant cut to precision `P`, in the form a column
    /// read as `Ts` holds it.
    fn push_now<Ts: Timestamp, P: Precision>(out: &mut AstPass<'_, '_, Self>);

    /// Pushes the timestamp one tick of precision `P` after the value of column `Col`, in
    /// the form a column read as `Ts` holds it: the earliest token a write may move that
    /// row to when it does not know the row's token.
    fn push_tick_past<Col: Column, Ts: Timestamp, P: Precision>(
        out: &mut AstPass<'_, '_, Self>,
    ) -> QueryResult<()>;

    /// Pushes the database's now moved by `shift`, at the clock's own precision: an
    /// instant for a column of zoned times `Ts` (PostgreSQL's `timestamptz`), else UTC
    /// without a zone. On SQLite it is text of fixed width (`%Y-%m-%d %H:%M:%f`), so
    /// values written and compared this way order as text the way they order in time.
    fn push_shifted<'b, Ts: Timestamp>(
        out: &mut AstPass<'_, 'b, Self>,
        shift: &'b Shift,
    ) -> QueryResult<()>;
}

#[cfg(feature = "postgres")]
impl ServerClock for diesel::pg::Pg {
    const GREATEST: &'static str = "GREATEST";

    fn push_now<Ts: Timestamp, P: Precision>(out: &mut AstPass<'_, '_, Self>) {
        // `timestamp` keeps UTC without a zone, `timestamptz` an instant.
        let now = if Ts::ZONED {
            "clock_timestamp()"
        } else {
            "clock_timestamp() AT TIME ZONE 'UTC'"
        };
        out.push_sql(&format!("date_trunc('{}', {now})", P::UNIT));
    }

    fn push_tick_past<Col: Column, Ts: Timestamp, P: Precision>(
        out: &mut AstPass<'_, '_, Self>,
    ) -> QueryResult<()> {
        out.push_sql(&format!("(date_trunc('{}', ", P::UNIT));
        out.push_identifier(Col::NAME)?;
        out.push_sql(&format!(") + interval '1 {}')", P::UNIT));
        Ok(())
    }

    fn push_shifted<'b, Ts: Timestamp>(
        out: &mut AstPass<'_, 'b, Self>,
        shift: &'b Shift,
    ) -> QueryResult<()> {
        out.push_sql(if Ts::ZONED {
            "(clock_timestamp() + "
        } else {
            "((clock_timestamp() AT TIME ZONE 'UTC') + "
        });
        out.push_bind_param::<diesel::sql_types::BigInt, i64>(&shift.micros)?;
        out.push_sql(" * interval '1 microsecond')");
        Ok(())
    }
}

#[cfg(feature = "mysql")]
impl ServerClock for diesel::mysql::Mysql {
    const GREATEST: &'static str = "GREATEST";

    // diesel's MySQL connections run in UTC, and the application's clock writes UTC too.
    fn push_now<Ts: Timestamp, P: Precision>(out: &mut AstPass<'_, '_, Self>) {
        out.push_sql(&format!("UTC_TIMESTAMP({})", P::DIGITS));
    }

    // A value written at precision `P` plus one tick; a finer one (written by hand) still
    // moves on by at least a tick, and the column rounds it to its own digits.
    fn push_tick_past<Col: Column, Ts: Timestamp, P: Precision>(
        out: &mut AstPass<'_, '_, Self>,
    ) -> QueryResult<()> {
        out.push_sql("(");
        out.push_identifier(Col::NAME)?;
        out.push_sql(&format!(" + INTERVAL {} MICROSECOND)", P::TICK_MICROS));
        Ok(())
    }

    fn push_shifted<'b, Ts: Timestamp>(
        out: &mut AstPass<'_, 'b, Self>,
        shift: &'b Shift,
    ) -> QueryResult<()> {
        out.push_sql("(UTC_TIMESTAMP(6) + INTERVAL ");
        out.push_bind_param::<diesel::sql_types::BigInt, i64>(&shift.micros)?;
        out.push_sql(" MICROSECOND)");
        Ok(())
    }
}

#[cfg(feature = "sqlite")]
impl ServerClock for diesel::sqlite::Sqlite {
    const GREATEST: &'static str = "max";

    // diesel writes `%F %T%.f`: no fraction when it is zero, else 3, 6 or 9 digits, and
    // `+00:00` after a zoned one. SQLite's `%f` always has 3; one statement sees one
    // `'now'`. In this form text order is time order, so `max` picks the later one.
    fn push_now<Ts: Timestamp, P: Precision>(out: &mut AstPass<'_, '_, Self>) {
        // `'now'` names no column: nothing here can fail.
        let _ = sqlite_stamp::<Ts, P>(out, |out| {
            out.push_sql("'now'");
            Ok(())
        });
    }

    // SQLite's date functions keep milliseconds, so the step is at least one: the value
    // cut to milliseconds plus one is still later than a value with microseconds.
    fn push_tick_past<Col: Column, Ts: Timestamp, P: Precision>(
        out: &mut AstPass<'_, '_, Self>,
    ) -> QueryResult<()> {
        let step = P::TICK_MICROS.max(1_000);
        let modifier = format!("'+{}.{:06} seconds'", step / 1_000_000, step % 1_000_000);
        sqlite_stamp::<Ts, P>(out, |out| {
            out.push_identifier(Col::NAME)?;
            out.push_sql(", ");
            out.push_sql(&modifier);
            Ok(())
        })
    }

    fn push_shifted<'b, Ts: Timestamp>(
        out: &mut AstPass<'_, 'b, Self>,
        shift: &'b Shift,
    ) -> QueryResult<()> {
        out.push_sql("strftime('%Y-%m-%d %H:%M:%f', 'now', ");
        out.push_bind_param::<diesel::sql_types::Text, String>(&shift.sqlite)?;
        out.push_sql(")");
        Ok(())
    }
}

/// `strftime(<the text diesel writes for a timestamp of precision P>, <time>)`, where
/// `time` pushes strftime's time value and modifiers.
#[cfg(feature = "sqlite")]
fn sqlite_stamp<Ts: Timestamp, P: Precision>(
    out: &mut AstPass<'_, '_, diesel::sqlite::Sqlite>,
    time: impl Fn(&mut AstPass<'_, '_, diesel::sqlite::Sqlite>) -> QueryResult<()>,
) -> QueryResult<()> {
    let strftime = |out: &mut AstPass<'_, '_, diesel::sqlite::Sqlite>, format: &str| {
        out.push_sql(&format!("strftime('{format}', "));
        time(out)?;
        out.push_sql(")");
        Ok::<(), diesel::result::Error>(())
    };
    if P::DIGITS == 0 {
        strftime(out, "%Y-%m-%d %H:%M:%S")?;
    } else {
        out.push_sql("CASE WHEN ");
        strftime(out, "%f")?;
        out.push_sql(" LIKE '%.000' THEN ");
        strftime(out, "%Y-%m-%d %H:%M:%S")?;
        out.push_sql(" ELSE ");
        strftime(out, "%Y-%m-%d %H:%M:%f")?;
        out.push_sql(" END");
    }
    if Ts::ZONED {
        out.push_sql(" || '+00:00'");
    }
    Ok(())
}

/// `"col" = GREATEST(<the server's now cut to P>, ?floor)`.
#[derive(Debug, Clone, Copy)]
pub struct DatabaseNow<Col, Ts, P> {
    floor: Ts,
    column: PhantomData<(Col, P)>,
}

impl<Col, Ts, P, DB> QueryFragment<DB> for DatabaseNow<Col, Ts, P>
where
    DB: ServerClock + HasSqlType<Col::SqlType>,
    Col: Column,
    Ts: Timestamp + ToSql<Col::SqlType, DB>,
    P: Precision,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_identifier(Col::NAME)?;
        out.push_sql(" = ");
        out.push_sql(DB::GREATEST);
        out.push_sql("(");
        DB::push_now::<Ts, P>(&mut out);
        out.push_sql(", ");
        out.push_bind_param::<Col::SqlType, Ts>(&self.floor)?;
        out.push_sql(")");
        Ok(())
    }
}

/// The last-modified guard on column `Col` read as `Ts`, stamped by the database's clock
/// at precision `P`.
pub struct DatabaseClockGuard<Col, Ts, P>(PhantomData<(Col, Ts, P)>);

impl<Col, Ts, P> GuardKind for DatabaseClockGuard<Col, Ts, P>
where
    Col: Column,
    Col::SqlType: SqlType<IsNull = NotNull>,
    Ts: Timestamp,
    P: Precision,
{
    type Token = Ts;
    type Predicate = TimeTokenHeld<Col, Ts, P>;
    type Advance = DatabaseNow<Col, Ts, P>;
    type Completion = ReturnedBy<Col>;
    const TOKEN_DIGITS: Option<u32> = Some(P::DIGITS);

    fn predicate(token: &Ts) -> Self::Predicate {
        TimeTokenHeld::new(*token)
    }

    /// The server computes the next timestamp, at least `floor`; the write reads it back.
    fn advance(token: &Ts) -> Option<(Self::Advance, Ts)> {
        let floor = one_tick_past::<Ts, P>(*token)?;
        let advance = DatabaseNow {
            floor,
            column: PhantomData,
        };
        Some((advance, floor))
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

impl<Col, Ts, P> Advancing for DatabaseClockGuard<Col, Ts, P> where Self: GuardKind {}

/// Column `Col` against the database's now moved by a shift: `"col" = <now>` after `SET`,
/// `"col" < <now>` or `"col" >= <now>` after `WHERE`. Expiry and claim times are written
/// and compared in this one form, so that they order the same way on every backend. `Ts`
/// says how the column keeps time: `NaiveDateTime` for UTC without a zone,
/// `DateTime<Utc>` for instants (PostgreSQL's `timestamptz`).
#[cfg(feature = "locks")]
#[derive(Debug, Clone)]
pub struct ClockColumn<Col, Ts = chrono::NaiveDateTime> {
    operator: &'static str,
    shift: Shift,
    column: PhantomData<(Col, Ts)>,
}

#[cfg(feature = "locks")]
impl<Col, Ts> ClockColumn<Col, Ts> {
    fn new(operator: &'static str, shift: Shift) -> Self {
        ClockColumn {
            operator,
            shift,
            column: PhantomData,
        }
    }

    /// `"col" = <now + shift>`.
    pub fn set(shift: Shift) -> Self {
        ClockColumn::new(" = ", shift)
    }

    /// `"col" < <now + shift>`.
    pub fn before(shift: Shift) -> Self {
        ClockColumn::new(" < ", shift)
    }

    /// `"col" >= <now + shift>`.
    pub fn not_before(shift: Shift) -> Self {
        ClockColumn::new(" >= ", shift)
    }
}

#[cfg(feature = "locks")]
impl<Col: Column, Ts: Timestamp, DB: ServerClock> QueryFragment<DB> for ClockColumn<Col, Ts> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_identifier(Col::NAME)?;
        out.push_sql(self.operator);
        DB::push_shifted::<Ts>(&mut out, &self.shift)
    }
}

/// `"col" = GREATEST(<now>, <one tick past "col">)`: a timestamp token moved on in SQL by
/// a write that does not know it. `now` is the caller's clock's, bound, or with `None`
/// the database's.
#[derive(Debug, Clone, Copy)]
pub struct TimestampPast<Col, Ts, P> {
    now: Option<Ts>,
    column: PhantomData<(Col, P)>,
}

impl<Col, Ts, P> TimestampPast<Col, Ts, P> {
    /// At least `now`, by the caller's clock.
    pub fn caller(now: Ts) -> Self {
        TimestampPast {
            now: Some(now),
            column: PhantomData,
        }
    }

    /// At least the database's now.
    pub fn database() -> Self {
        TimestampPast {
            now: None,
            column: PhantomData,
        }
    }
}

impl<Col, Ts, P, DB> QueryFragment<DB> for TimestampPast<Col, Ts, P>
where
    DB: ServerClock + HasSqlType<Col::SqlType>,
    Col: Column,
    Ts: Timestamp + ToSql<Col::SqlType, DB>,
    P: Precision,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_identifier(Col::NAME)?;
        out.push_sql(" = ");
        out.push_sql(DB::GREATEST);
        out.push_sql("(");
        match &self.now {
            Some(now) => out.push_bind_param::<Col::SqlType, Ts>(now)?,
            None => DB::push_now::<Ts, P>(&mut out),
        }
        out.push_sql(", ");
        DB::push_tick_past::<Col, Ts, P>(&mut out)?;
        out.push_sql(")");
        Ok(())
    }
}

/// The database computes the next timestamp from the row's own: no row is left out.
impl<Col, Ts, P> AdvanceInSql for DatabaseClockGuard<Col, Ts, P>
where
    Self: GuardKind<Token = Ts>,
    Col: Column,
{
    type AdvanceAny = TimestampPast<Col, Ts, P>;
    type CanAdvance = Unguarded;
    type TokenColumn = Col;
    type ReadBack = crate::sql::new_token::ReturnedBy<Col>;

    fn advance_any() -> Self::AdvanceAny {
        TimestampPast::database()
    }

    fn can_advance() -> Unguarded {
        Unguarded
    }

    fn at_end(_: &Ts) -> bool {
        false
    }
}
