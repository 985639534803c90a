//! The writes of one entity's row: a guarded update or delete, a changed-columns save,
//! and the two writes outside the guard (excluded fields, the update time).

use diesel::query_builder::AsChangeset;

use crate::error::Error;
use crate::guard::pre_image::{ChangedColumns, ChangedUpdateOf};
use crate::guard::{Guarded, TokenOf};
use crate::sql::statement::{Comma, Joined, Unguarded};

use super::Operation;

/// A guarded update of the row with `key` from token `expected`: the changes `Ch`, the
/// guard's advance and the update time, written only while the row holds `expected`.
/// Answers the token the row then holds.
pub struct Update<T: Guarded, Ch> {
    pub(crate) key: T::Key,
    pub(crate) expected: TokenOf<T>,
    pub(crate) changes: Ch,
    pub(crate) stamp: T::Stamp,
    /// For a save: the state of the saved copy.
    pub(crate) saved: Option<SavedState<T>>,
    /// Inside a transaction of the library's (a read-modify-write attempt).
    pub(crate) own: bool,
}

impl<T: Guarded, Ch> Update<T, Ch> {
    /// The update of `key` from `expected` with `changes`, stamped now.
    pub(crate) fn new(key: T::Key, expected: TokenOf<T>, changes: Ch) -> Self {
        Self {
            key,
            expected,
            changes,
            stamp: T::stamp(),
            saved: None,
            own: false,
        }
    }

    /// The save of `row`: the row must still be in `row`'s state.
    pub(crate) fn saving(mut self, row: &T) -> Self {
        self.saved = Some(SavedState::of(row));
        self
    }

    /// The save of `copy`, edited from `original` (whose key and token this update holds):
    /// refused when the copy moved to another state.
    pub(crate) fn saving_from(mut self, copy: &T, original: &T) -> Self {
        self.saved = Some(SavedState::edited_from(copy, original));
        self
    }

    /// Stamped `stamp` (the value the caller records in its copy).
    pub(crate) fn stamped(mut self, stamp: T::Stamp) -> Self {
        self.stamp = stamp;
        self
    }

    /// Inside a transaction of the library's, when `own`.
    pub(crate) fn owned_transaction(mut self, own: bool) -> Self {
        self.own = own;
        self
    }
}

/// The state of a copy being saved: the statement keeps the row's status to it, and a
/// miss names it.
pub struct SavedState<T: Guarded> {
    kept: T::StatusKept,
    name: Option<&'static str>,
    /// The state of the copy it was edited from, when that is another copy.
    from: Option<&'static str>,
    /// Why the copy may not be written: a JSON document field that is not an object.
    unwritable: Option<(&'static str, String)>,
}

impl<T: Guarded> SavedState<T> {
    /// The state `row` is in.
    pub(crate) fn of(row: &T) -> Self {
        Self {
            kept: row.status_kept(),
            name: row.status_name(),
            from: None,
            unwritable: row.unwritable_document(),
        }
    }

    /// The state of `copy`, edited from `original`.
    pub(crate) fn edited_from(copy: &T, original: &T) -> Self {
        Self {
            from: original.status_name(),
            ..Self::of(copy)
        }
    }

    /// [`Error::StatusNotWritable`] when the copy is in another state than the original it
    /// was edited from: a save never writes the state, so it refuses rather than drop the
    /// move. Checked before anything is sent.
    /// Also [`Error::InvalidPatch`] when a JSON document field of the copy is not an
    /// object.
    pub(crate) fn refuse_move(
        saved: Option<&Self>,
        table: &'static str,
        key: &T::Key,
    ) -> Result<(), Error> {
        if let Some((column, reason)) = saved.and_then(|saved| saved.unwritable.clone()) {
            return Err(Error::InvalidPatch {
                table,
                key: format!("{key:?}"),
                column,
                reason,
            });
        }
        match saved.map(|saved| (saved.from, saved.name)) {
            Some((Some(from), Some(to))) if from != to => Err(Error::StatusNotWritable {
                table,
                column: T::STATUS_COLUMN.unwrap_or_default().to_string(),
                detail: format!("the copy moved from `{from}` to `{to}`"),
            }),
            _ => Ok(()),
        }
    }

    /// What the statement keeps and the state's name, of a save (`Some`) or of an update.
    pub(crate) fn split(saved: Option<Self>) -> (Option<T::StatusKept>, Option<&'static str>) {
        match saved {
            Some(saved) => (Some(saved.kept), saved.name),
            None => (None, None),
        }
    }
}

impl<T: Guarded, Ch> Operation for Update<T, Ch> {
    type Output = TokenOf<T>;
    type Error = Error;
}

/// A guarded delete of the row with `key`, only while it holds `expected`.
pub struct Delete<T: Guarded> {
    pub(crate) key: T::Key,
    pub(crate) expected: TokenOf<T>,
}

impl<T: Guarded> Delete<T> {
    /// The delete of `key` while it holds `expected`.
    pub(crate) fn new(key: T::Key, expected: TokenOf<T>) -> Self {
        Self { key, expected }
    }
}

impl<T: Guarded> Operation for Delete<T> {
    type Output = ();
    type Error = Error;
}

/// A write of `changes` to the excluded fields (`#[occ(exclude)]`) of the row with `key`,
/// whatever token it holds; the token neither checked nor advanced.
pub struct WriteExcluded<T: Guarded, Ch> {
    pub(crate) key: T::Key,
    pub(crate) changes: Ch,
}

impl<T: Guarded, Ch> WriteExcluded<T, Ch> {
    /// The write of `changes` to the row with `key`.
    pub(crate) fn new(key: T::Key, changes: Ch) -> Self {
        Self { key, changes }
    }
}

impl<T: Guarded, Ch> Operation for WriteExcluded<T, Ch> {
    type Output = ();
    type Error = Error;
}

/// A maintenance write of the `#[occ(updated_at)]` column of the row with `key`,
/// whatever token it holds.
pub struct TouchStamp<T: Guarded> {
    pub(crate) key: T::Key,
    pub(crate) stamp: T::Stamp,
}

impl<T: Guarded> TouchStamp<T> {
    /// The write of `stamp` to the row with `key`.
    pub(crate) fn new(key: T::Key, stamp: T::Stamp) -> Self {
        Self { key, stamp }
    }
}

impl<T: Guarded> Operation for TouchStamp<T> {
    type Output = ();
    type Error = Error;
}

/// A changed-columns save (Hibernate's "dirty" mode): the fields a copy changed since the
/// copy it was edited from, written only while the row still holds their old values.
/// Answers whether a statement was sent (none when nothing changed).
pub struct SaveChanged<T: ChangedColumns> {
    key: T::Key,
    expected: TokenOf<T>,
    state: SavedState<T>,
    changed: Option<(T::ChangedValues, T::OldValues)>,
    stamp: T::Stamp,
}

impl<T: ChangedColumns> SaveChanged<T> {
    /// The save of what `copy` changed since `original`, stamped `stamp`.
    pub(crate) fn new(copy: &T, original: &T, stamp: T::Stamp) -> Self {
        Self {
            key: original.key(),
            expected: original.token(),
            state: SavedState::edited_from(copy, original),
            changed: copy.changed_since(original),
            stamp,
        }
    }

    /// The statement to send on `table`, with the key and the token its miss is explained
    /// by; `None` when nothing changed (nothing is sent, so not even a missing row is
    /// noticed). Refused when the copy moved to another state.
    pub(crate) fn statement(
        self,
        table: &'static str,
    ) -> Result<Option<ChangedStatement<T>>, Error> {
        SavedState::refuse_move(Some(&self.state), table, &self.key)?;
        let Some((changes, predicate)) = self.changed else {
            return Ok(None);
        };
        let statement = ChangedUpdateOf::<T>::new(
            T::table(),
            changes.as_changeset(),
            Joined(Unguarded, self.stamp, Comma),
            T::key_predicate(&self.key),
            predicate,
        );
        Ok(Some((statement, self.key, self.expected)))
    }
}

/// A changed-columns write's statement, with the key and the token its miss is
/// explained by.
pub(crate) type ChangedStatement<T> = (ChangedUpdateOf<T>, <T as Guarded>::Key, TokenOf<T>);

impl<T: ChangedColumns> Operation for SaveChanged<T> {
    type Output = bool;
    type Error = Error;
}
