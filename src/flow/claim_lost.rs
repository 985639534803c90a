//! Why a claim's statement matched fewer rows than it must, judged from the rows as they
//! are now: a claim lost to another worker, or rows the database left alone.

use crate::error::Error;
use crate::flow::miss::RowMoved;
use crate::guard::status::{HasStatus, Status};
use crate::guard::{AdvanceInSql, Guarded};

/// A claim's update (MySQL's, after its locked read) matched fewer rows than its read had
/// locked: nobody else can have
/// moved them, so the first row still holding the token it was locked with was left
/// alone, at the end of its tokens ([`Error::VersionOverflow`]) or by the database
/// ([`Error::Refused`]).
pub(crate) struct ClaimIgnored<'a, T> {
    pub(crate) locked: &'a [T],
    pub(crate) table: &'static str,
}

impl<T> ClaimIgnored<'_, T>
where
    T: Guarded,
    T::Guard: AdvanceInSql,
{
    /// The explanation, given the locked rows as they are now.
    pub(crate) fn given(self, mut current: Vec<T>) -> Error {
        let keys: Vec<T::Key> = self.locked.iter().map(Guarded::key).collect();
        let ignored = self.locked.iter().position(|locked| {
            let now = current.iter().find(|c| c.key() == locked.key());
            now.is_none_or(|now| now.token() == locked.token())
        });
        let key = &keys[ignored.unwrap_or(0)];
        let found = current.iter().position(|c| c.key() == *key);
        let current = found.map(|i| current.swap_remove(i));
        RowMoved::<T>::advancing_any(key, T::Guard::at_end).given_in(self.table, current)
    }
}

/// The end of a claim matched nothing: the row is gone ([`Error::NotFound`]), its token
/// cannot advance ([`Error::VersionOverflow`]), or another worker holds it or it left the
/// held state ([`Error::LockLost`]).
pub(crate) struct ClaimLost<'k, T: HasStatus> {
    pub(crate) key: &'k T::Key,
    pub(crate) owner: &'k str,
    pub(crate) held: T::Status,
}

impl<T> ClaimLost<'_, T>
where
    T: HasStatus,
    T::Guard: AdvanceInSql,
{
    /// The explanation, given the row (in `table`) as it is now.
    pub(crate) fn given(self, table: &'static str, row: Option<T>) -> Error {
        let (key, owner) = (self.key, self.owner);
        match row {
            None => RowMoved::<T>::any(key).given_in(table, None),
            Some(row) if T::Guard::at_end(&row.token()) => {
                RowMoved::<T>::advancing_any(key, T::Guard::at_end).given_in(table, Some(row))
            }
            Some(_) => Error::LockLost {
                lock: format!(
                    "claim of `{table}` row {key:?} by {owner:?} (in state `{}`)",
                    self.held.name()
                ),
                why: "the row left that state or another owner claimed it".into(),
            },
        }
    }
}
