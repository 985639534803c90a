//! Rows that had a write conflict lately, remembered per process, so that the next
//! read-modify-write of such a row reads it with its lock from the first attempt
//! ([`Contention::LockWhenContended`](crate::retry::Contention::LockWhenContended)).
//!
//! A row is known by a hash of its table and key. A collision or a forgotten row costs
//! only speed: one more locked read, or one more lock-free read that may conflict.

use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{LazyLock, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The most rows remembered at once; when full, rows past their time are forgotten, and
/// if none are, all are.
const CAPACITY: usize = 4096;

/// When each remembered row last had a conflict.
static LAST_CONFLICT: LazyLock<Mutex<HashMap<u64, Instant>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

fn rows() -> MutexGuard<'static, HashMap<u64, Instant>> {
    // The map holds no invariant a panicking thread could break halfway.
    LAST_CONFLICT.lock().unwrap_or_else(|e| e.into_inner())
}

/// One row of one table, as the memory knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HotRow(u64);

impl HotRow {
    pub(crate) fn of(table: &str, key: &dyn Debug) -> Self {
        let mut hasher = DefaultHasher::new();
        table.hash(&mut hasher);
        format!("{key:?}").hash(&mut hasher);
        HotRow(hasher.finish())
    }

    /// Whether this row had a conflict within the last `hot_for`.
    pub(crate) fn is_hot(self, hot_for: Duration) -> bool {
        rows().get(&self.0).is_some_and(|at| at.elapsed() < hot_for)
    }

    /// Records a conflict on this row now; `hot_for` is how long conflicts are kept.
    pub(crate) fn mark(self, hot_for: Duration) {
        let mut rows = rows();
        if rows.len() >= CAPACITY && !rows.contains_key(&self.0) {
            rows.retain(|_, at| at.elapsed() < hot_for);
            if rows.len() >= CAPACITY {
                rows.clear();
            }
        }
        rows.insert(self.0, Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conflict_makes_its_row_hot_for_a_while() {
        let row = HotRow::of("hot_rows_test", &1_i64);
        let other = HotRow::of("hot_rows_test", &2_i64);
        assert!(!row.is_hot(Duration::from_secs(60)));
        row.mark(Duration::from_secs(60));
        assert!(row.is_hot(Duration::from_secs(60)));
        assert!(!row.is_hot(Duration::ZERO));
        assert!(!other.is_hot(Duration::from_secs(60)));
    }

    #[test]
    fn the_same_key_in_another_table_is_another_row() {
        assert_ne!(HotRow::of("a", &1_i64), HotRow::of("b", &1_i64));
        assert_eq!(HotRow::of("a", &"x"), HotRow::of("a", &"x"));
    }
}
