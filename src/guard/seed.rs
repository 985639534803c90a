//! The first token of an inserted row.
//!
//! A key can be deleted and inserted again; a copy read before the delete still holds a
//! token of the old row. If the new row started at the same token (version 0, the seed
//! of every hand-written insert), that stale copy would write into the new row. So rows
//! inserted by [`guarded_insert`](crate::GuardedWrite::guarded_insert) start past every
//! token the old row can have handed out:
//!
//! - a version starts at the writer's clock in microseconds since 1970 (and past the
//!   copy's own version and the last seed of this process): an old row would have needed
//!   more than one write per microsecond of its life to reach it. Only 64-bit versions
//!   hold such a number; narrower ones are refused at compile time;
//! - a last-modified timestamp starts at now, at least a tick past the copy's own, as
//!   any write of the row does;
//! - a pre-image has no token of its own: a stale copy that matches the new row's values
//!   writes over values equal to the ones it read, which loses nothing.
//!
//! `xmin` and the database's clock are set by the database: any insert gives the row a
//! new transaction id, and an insert that leaves a database-clock column to its default
//! (`DEFAULT CURRENT_TIMESTAMP(6)`) stamps it with the server's now, past every stamp of
//! the old row once the server's clock has passed the last one (writes faster than one
//! per tick run a tick ahead of the clock; SQLite's tick is a millisecond). Insert such
//! rows with diesel.

use std::sync::atomic::{AtomicI64, Ordering};

use crate::guard::version::{VersionColumnFor, VersionGuard};
use crate::guard::GuardKind;

/// A guard kind whose inserted rows the writer seeds (see the module documentation).
#[diagnostic::on_unimplemented(
    message = "`guarded_insert` cannot seed the token of `{Self}`",
    note = "a version must be `i64` (or `u64` on MySQL) to start at the clock in microseconds, so that a key deleted and inserted again never repeats an old row's version; widen the column to BIGINT",
    note = "`xmin`, `row_version` and database-clock tokens are set by the database: insert such rows with diesel (leave the column to its DEFAULT)"
)]
pub trait SeedsTokens: GuardKind {
    /// The first token of a row inserted from a copy holding `token`.
    fn seed(token: &Self::Token) -> Self::Token;
}

/// The last version seed this process handed out: seeds are unique within it even when
/// the clock stands still or steps back.
static LAST_SEED: AtomicI64 = AtomicI64::new(0);

/// The writer's clock in microseconds since 1970, past `floor` and past the last seed
/// this process handed out.
fn version_seed(floor: i64) -> i64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            i64::try_from(since.as_micros()).unwrap_or(i64::MAX)
        });
    let wanted = now.max(floor.saturating_add(1));
    let previous = LAST_SEED.fetch_max(wanted, Ordering::SeqCst);
    if previous < wanted {
        wanted
    } else {
        // Another seed took this microsecond: take the next one free.
        LAST_SEED.fetch_add(1, Ordering::SeqCst).saturating_add(1)
    }
}

impl<Col> SeedsTokens for VersionGuard<Col, i64>
where
    Col: diesel::Column + VersionColumnFor<i64>,
{
    fn seed(token: &i64) -> i64 {
        version_seed(*token)
    }
}

#[cfg(feature = "mysql")]
impl<Col> SeedsTokens for VersionGuard<Col, u64>
where
    Col: diesel::Column + VersionColumnFor<u64>,
{
    fn seed(token: &u64) -> u64 {
        let floor = i64::try_from(*token).unwrap_or(i64::MAX);
        u64::try_from(version_seed(floor)).unwrap_or(*token)
    }
}

#[cfg(feature = "chrono")]
impl<Col, Ts, K, P> SeedsTokens for crate::guard::timestamp::LastModifiedGuard<Col, Ts, K, P>
where
    Self: GuardKind<Token = Ts>,
    Ts: crate::guard::timestamp::Timestamp,
    K: crate::guard::timestamp::Clock,
    P: crate::guard::timestamp::Precision,
{
    fn seed(token: &Ts) -> Ts {
        crate::guard::timestamp::next_timestamp::<Ts, K, P>(*token).unwrap_or(*token)
    }
}

#[cfg(test)]
mod tests {
    use super::version_seed;

    #[test]
    fn version_seeds_are_past_the_clock_the_floor_and_each_other() {
        let first = version_seed(0);
        assert!(
            first > 1_700_000_000_000_000,
            "microseconds since 1970: {first}"
        );
        let seeds: Vec<i64> = (0..1000).map(|_| version_seed(0)).collect();
        assert!(seeds.windows(2).all(|w| w[0] < w[1]));
        assert!(seeds[0] > first);
        assert_eq!(version_seed(i64::MAX / 2), i64::MAX / 2 + 1);
    }
}
