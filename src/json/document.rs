//! JSON extension columns edited by read-merge-write under the entity's guard, with retry.
//!
//! Mark the `serde_json::Value` field of the column with `#[occ(json)]`. Every edit reads
//! the row, applies the edit to the document as read, and writes the document back
//! guarded by the row's token; when another writer got in between, the guard misses and
//! the edit starts again from a fresh read ([`RetryPolicy`]). So a concurrent writer's
//! keys are never dropped: the edit is always applied to the latest document.
//!
//! The edits: an RFC 7396 merge patch ([`merge_json`](GuardedJson::merge_json), `null`
//! deletes a key), an RFC 6902 JSON Patch with `test` ([`patch_json`](GuardedJson::patch_json),
//! for HTTP PATCH bodies), set or remove at an RFC 6901 pointer, a closure on the
//! document, or a closure on a typed view of it
//! ([`update_json_as`](GuardedJson::update_json_as)).
//!
//! Rules every edit keeps:
//! - the stored document must be a JSON object, and so must the result; anything else is
//!   [`Error::InvalidData`] (stored) or [`Error::InvalidPatch`] (result), nothing written.
//! - a result larger than [`DOCUMENT_LIMIT_BYTES`] is refused, nothing written.
//! - an edit that leaves the document as it was writes nothing: the row keeps its token.
//!
//! For pure merges there is a faster path that never conflicts: one statement that merges
//! in SQL ([`json_merge`](crate::json::merge_in_place)).

use diesel::connection::LoadConnection;
use diesel::query_builder::AsChangeset;
use diesel::Column;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::connect::backend::OccBackend;
use crate::connect::transaction::WriteTransaction;
use crate::drive::blocking::load::LoadByKey;
use crate::drive::blocking::Sourced;
use crate::drive::read_modify_write::{read_modify_write, Step};
use crate::drive::{now, UpdateOn};
use crate::error::{Error, Token};
use crate::guard::{GuardKind, Guarded, TokenOf};
use crate::operation::{JsonEdit, Operation, Run, Update};
use crate::retry::{RetryPolicy, Stop};
use crate::sql::statement::ColumnEq;
use crate::write::entity::UpdateRow;
use crate::write::modify::Modified;

/// The largest document an edit may write, serialized: 1 MiB. Every retry reads and
/// writes the whole document, so a larger one makes each conflict expensive and belongs
/// in its own table; MySQL's default `max_allowed_packet` (64 MiB, MariaDB 16 MiB) and
/// PostgreSQL's jsonb limit (255 MiB) are far above it.
pub const DOCUMENT_LIMIT_BYTES: usize = 1 << 20;

/// An entity with the JSON document column `Col` (`#[occ(json)]` on its field).
pub trait JsonDocument<Col>: Guarded {
    /// The document as read.
    fn document(&self) -> &Value;
    /// The document, to edit.
    fn document_mut(&mut self) -> &mut Value;
}

/// The `#[occ(json)]` field as a document: a field of another type is a compile error
/// here, at the field.
#[doc(hidden)]
pub fn field(document: &Value) -> &Value {
    document
}

/// [`field`], to edit.
#[doc(hidden)]
pub fn field_mut(document: &mut Value) -> &mut Value {
    document
}

/// `SET "col" = ?`: the changeset that writes a document back.
#[derive(Debug, Clone)]
pub struct SetDocument<Col>(ColumnEq<Col, Value>);

impl<Col: Column> AsChangeset for SetDocument<Col> {
    type Target = Col::Table;
    type Changeset = ColumnEq<Col, Value>;

    fn as_changeset(self) -> Self::Changeset {
        self.0
    }
}

/// A read-merge-write edit of the document in column `Col` of entity `Self` on
/// connection `C`, as one bound; like [`UpdateRow`](crate::UpdateRow), not a trait to
/// implement.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot edit the JSON document in `{Col}` on `{C}`",
    note = "the column must be the entity's `#[occ(json)]` field, the connection a diesel connection of a backend diesel-occ supports that can open write transactions, and the guard's SQL must fit that backend",
    note = "on a diesel-async connection, call the async API instead: `use diesel_occ::asynchronous::prelude::*`, not `diesel_occ::prelude::*`"
)]
pub trait EditJson<C, Col>: JsonDocument<Col> + LoadByKey<C> + Clone {
    /// Runs the edit; [`GuardedJson`] calls it.
    #[doc(hidden)]
    fn edit_document<R, E: From<Error>>(
        conn: &mut C,
        key: &Self::Key,
        policy: &RetryPolicy,
        pin: Option<Pin>,
        edit: impl FnMut(&mut Value) -> Result<R, E>,
    ) -> Result<Modified<Self, R>, E>;
}

impl<T, C, Col, R, E> Run<C> for JsonEdit<'_, T, Col, R, E>
where
    T: EditJson<C, Col>,
    E: From<Error>,
{
    fn run(self, conn: &mut C) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        let (key, policy, pin, build) = self.into_parts();
        let edit = build(T::table_name(), &key)?;
        T::edit_document(conn, &key, &policy, pin, edit)
    }
}

// Errors name this trait and its hints, not the first bound of the impl that fails.
#[diagnostic::do_not_recommend]
impl<T, C, Col> EditJson<C, Col> for T
where
    T: JsonDocument<Col> + LoadByKey<C> + Clone,
    C: LoadConnection + WriteTransaction,
    C::Backend: OccBackend,
    Col: Column<Table = T::Table>,
    T: UpdateRow<C, SetDocument<Col>>,
{
    fn edit_document<R, E: From<Error>>(
        conn: &mut C,
        key: &T::Key,
        policy: &RetryPolicy,
        pin: Option<Pin>,
        edit: impl FnMut(&mut Value) -> Result<R, E>,
    ) -> Result<Modified<T, R>, E> {
        let place = Place::<T, Col>::new(T::table_name(), key);
        let step = EditDocument { place, pin, edit };
        now(read_modify_write(
            Sourced(conn),
            key,
            policy,
            &suspects::<T, Col>(),
            step,
        ))
    }
}

/// A check of the row an edit applies to, made on every attempt's read before the edit
/// runs, given the row's token: an HTTP `If-Match` pins an edit to the representations the
/// client saw. Its error ends the edit, nothing written.
pub(crate) type Pin = Box<dyn Fn(&Token) -> Result<(), Error> + Send + Sync>;

/// The step of an edit, on either driver: `edit` on the document as read (once `pin`, if
/// any, accepts the row), written back under the row's guard when it changed anything.
pub(crate) struct EditDocument<T, Col, F> {
    pub(crate) place: Place<T, Col>,
    pub(crate) pin: Option<Pin>,
    pub(crate) edit: F,
}

impl<T, C, Col, F, R, E> Step<T, C, R, E> for EditDocument<T, Col, F>
where
    T: JsonDocument<Col> + Clone + UpdateOn<C, SetDocument<Col>>,
    Col: Column,
    F: FnMut(&mut Value) -> Result<R, E>,
{
    const OPERATION: &'static str = "edit_json";

    async fn apply<'a>(
        &'a mut self,
        conn: &'a mut C,
        original: &'a T,
    ) -> Result<(T, TokenOf<T>, R), Stop<E>> {
        if let Some(pin) = &self.pin {
            pin(&T::Guard::describe(&original.token())).map_err(Stop::Occ)?;
        }
        match edited(&self.place, original, &mut self.edit)? {
            Edited::Unchanged(done) => Ok(done),
            Edited::Write(document, stamp, record) => {
                let update = Update::new(original.key(), original.token(), document)
                    .stamped(stamp)
                    .owned_transaction(true);
                let token = match (T::update_on(conn, update).await, &self.pin) {
                    // The row moved on since the read: pinned to tags the row no longer
                    // holds, the edit ends here (a retry could only refuse it again).
                    (Err(Error::Conflict(conflict)), Some(pin)) => {
                        pin(&conflict.found).map_err(Stop::Occ)?;
                        return Err(Stop::Occ(Error::Conflict(conflict)));
                    }
                    (written, _) => written?,
                };
                Ok(record.written(token))
            }
        }
    }
}

/// The columns an unreadable row is blamed on: the document's first, then the guard's.
pub(crate) fn suspects<T: Guarded, Col: Column>() -> String {
    format!("{} (or {})", Col::NAME, T::GUARD_COLUMNS.join(", "))
}

/// One attempt's edit of the document of `original`, before anything is written.
pub(crate) enum Edited<T: Guarded, Col, R> {
    /// The edit left the document as it was: nothing to write, the row keeps its token.
    Unchanged((T, TokenOf<T>, R)),
    /// The document changed: write it back with the entity's stamp (`updated_at`), then
    /// record the write in the row.
    Write(SetDocument<Col>, T::Stamp, Record<T, R>),
}

/// An edited row waiting for its write: what the row records once written.
pub(crate) struct Record<T: Guarded, R> {
    row: T,
    value: R,
    stamp: T::Stamp,
}

impl<T: Guarded, R> Record<T, R> {
    /// The row as written with `token`: its new token and the stamp that was sent, so that
    /// it reads as the database now holds it; with the edit's value.
    pub(crate) fn written(mut self, token: TokenOf<T>) -> (T, TokenOf<T>, R) {
        self.row.set_token(token.clone());
        self.row.set_stamp(&self.stamp);
        (self.row, token, self.value)
    }
}

/// Runs `edit` on a copy of `original`'s document, with the rules every edit keeps (a
/// stored object, a resulting object within the size limit); what the sync and async
/// paths share.
pub(crate) fn edited<T, Col, R, E>(
    place: &Place<T, Col>,
    original: &T,
    edit: &mut impl FnMut(&mut Value) -> Result<R, E>,
) -> Result<Edited<T, Col, R>, Stop<E>>
where
    T: JsonDocument<Col> + Clone,
    Col: Column,
{
    if !original.document().is_object() {
        return Err(Stop::Occ(place.stored(original.document())));
    }
    let mut row = original.clone();
    let value = edit(row.document_mut()).map_err(Stop::Caller)?;
    place.check_result(row.document())?;
    if row.document() == original.document() {
        return Ok(Edited::Unchanged((row, original.token(), value)));
    }
    let document = SetDocument(ColumnEq::new(row.document().clone()));
    let stamp = T::stamp();
    let record = Record {
        row,
        value,
        stamp: stamp.clone(),
    };
    Ok(Edited::Write(document, stamp, record))
}

/// Read-merge-write edits of JSON columns for every entity with one (see the module
/// documentation). Each takes the column (`orders::ext`) so that an entity may have
/// several, and returns the row as written with its token and the number of attempts.
pub trait GuardedJson: Guarded + Clone {
    /// Runs `edit` on the document of column `Col` of the row with `key`, read fresh on
    /// every attempt, and writes the result under the row's guard. `edit` may stop with
    /// the caller's own error, which comes back unchanged; it runs once per attempt.
    fn edit_json<C, Col, R, E>(
        conn: &mut C,
        key: &Self::Key,
        column: Col,
        policy: &RetryPolicy,
        edit: impl FnMut(&mut Value) -> Result<R, E>,
    ) -> Result<Modified<Self, R>, E>
    where
        Col: Column,
        Self: EditJson<C, Col>,
        E: From<Error>,
    {
        let _ = column;
        Self::edit_document(conn, key, policy, None, edit)
    }

    /// Applies the RFC 7396 merge `patch` (an object; `null` deletes a key, other values
    /// replace, objects merge recursively) to the document of column `Col`.
    fn merge_json<C, Col>(
        conn: &mut C,
        key: &Self::Key,
        column: Col,
        patch: &Value,
        policy: &RetryPolicy,
    ) -> Result<Modified<Self, ()>, Error>
    where
        Col: Column,
        Self: EditJson<C, Col>,
    {
        let edit = merge_edit(Place::<Self, Col>::new(Self::table_name(), key), patch)?;
        Self::edit_json(conn, key, column, policy, edit)
    }

    /// Applies the RFC 6902 JSON Patch `patch` (add, remove, replace, move, copy, test) to
    /// the document of column `Col`, all operations or none. A failed `test` (the document
    /// is not what the client saw) or an operation that does not fit the document is
    /// [`Error::InvalidPatch`] and writes nothing; it is not retried, since the document
    /// it was checked against was the latest.
    fn patch_json<C, Col>(
        conn: &mut C,
        key: &Self::Key,
        column: Col,
        patch: &json_patch::Patch,
        policy: &RetryPolicy,
    ) -> Result<Modified<Self, ()>, Error>
    where
        Col: Column,
        Self: EditJson<C, Col>,
    {
        let edit = patch_edit(Place::<Self, Col>::new(Self::table_name(), key), patch);
        Self::edit_json(conn, key, column, policy, edit)
    }

    /// [`merge_json`](Self::merge_json) pinned to a request's `If-Match` (feature
    /// `http`): with tags, the merge applies only to a row whose tag is among them, and
    /// otherwise ends, nothing written, with [`Error::Precondition`] (412 with the current
    /// `ETag`). A row that moves on between the read and the write ends the edit the same
    /// way at once, unless its new tag is also among those sent (then the merge applies to
    /// that version, as the client allowed). With `*` it applies to the latest row;
    /// absent, too, retried as `merge_json` is. A missing row is [`Error::NotFound`]
    /// (404) whatever the header says: a PATCH does not create the row, so RFC 9110
    /// (section 13.2.1) answers it as if unconditional. Take
    /// [`Precondition::required`](crate::http::Precondition::required) first where the
    /// write needs an `If-Match` (428 without).
    #[cfg(feature = "http")]
    fn merge_json_if_match<C, Col>(
        conn: &mut C,
        key: &Self::Key,
        column: Col,
        patch: &Value,
        if_match: &crate::http::Precondition,
        policy: &RetryPolicy,
    ) -> Result<Modified<Self, ()>, Error>
    where
        Col: Column,
        Self: EditJson<C, Col>,
    {
        let _ = column;
        let edit = merge_edit(Place::<Self, Col>::new(Self::table_name(), key), patch)?;
        Self::edit_document(conn, key, policy, if_match.pin(), edit)
    }

    /// [`patch_json`](Self::patch_json) pinned to a request's `If-Match` (feature
    /// `http`), as [`merge_json_if_match`](Self::merge_json_if_match) pins a merge.
    #[cfg(feature = "http")]
    fn patch_json_if_match<C, Col>(
        conn: &mut C,
        key: &Self::Key,
        column: Col,
        patch: &json_patch::Patch,
        if_match: &crate::http::Precondition,
        policy: &RetryPolicy,
    ) -> Result<Modified<Self, ()>, Error>
    where
        Col: Column,
        Self: EditJson<C, Col>,
    {
        let _ = column;
        let edit = patch_edit(Place::<Self, Col>::new(Self::table_name(), key), patch);
        Self::edit_document(conn, key, policy, if_match.pin(), edit)
    }

    /// Sets the value at the RFC 6901 `pointer` (`/address/city`) of the document of
    /// column `Col`, creating the objects on the way. A pointer through a scalar or past
    /// the end of an array is [`Error::InvalidPatch`]; the root cannot be set.
    fn set_json<C, Col>(
        conn: &mut C,
        key: &Self::Key,
        column: Col,
        pointer: &str,
        value: Value,
        policy: &RetryPolicy,
    ) -> Result<Modified<Self, ()>, Error>
    where
        Col: Column,
        Self: EditJson<C, Col>,
    {
        let edit = set_edit(
            Place::<Self, Col>::new(Self::table_name(), key),
            pointer,
            value,
        )?;
        Self::edit_json(conn, key, column, policy, edit)
    }

    /// Removes the value at the RFC 6901 `pointer` of the document of column `Col`; a value
    /// that is not there leaves the document (and the row) as it is. A pointer through a
    /// scalar is [`Error::InvalidPatch`]; the root cannot be removed.
    fn remove_json<C, Col>(
        conn: &mut C,
        key: &Self::Key,
        column: Col,
        pointer: &str,
        policy: &RetryPolicy,
    ) -> Result<Modified<Self, ()>, Error>
    where
        Col: Column,
        Self: EditJson<C, Col>,
    {
        let edit = remove_edit(Place::<Self, Col>::new(Self::table_name(), key), pointer)?;
        Self::edit_json(conn, key, column, policy, edit)
    }

    /// Runs `edit` on the document of column `Col` read as the typed struct `D`, and
    /// writes back only what `edit` changed, as a merge patch of `D`'s fields applied to
    /// the document as read. Keys `D` does not know (another service's) are never
    /// touched, so `D` needs no catch-all field; a field `edit` sets to `None` (serialized
    /// as `null` or left out) is removed from the document. A document that does not read
    /// as `D` is [`Error::InvalidData`].
    fn update_json_as<D, C, Col, R, E>(
        conn: &mut C,
        key: &Self::Key,
        column: Col,
        policy: &RetryPolicy,
        edit: impl FnMut(&mut D) -> Result<R, E>,
    ) -> Result<Modified<Self, R>, E>
    where
        D: Serialize + DeserializeOwned,
        Col: Column,
        Self: EditJson<C, Col>,
        E: From<Error>,
    {
        let edit = typed_edit(Place::<Self, Col>::new(Self::table_name(), key), edit);
        Self::edit_json(conn, key, column, policy, edit)
    }
}

/// The edit of [`GuardedJson::merge_json`]: the merge `patch`, checked to be an object.
pub(crate) fn merge_edit<T: Guarded, Col: Column>(
    place: Place<T, Col>,
    patch: &Value,
) -> Result<impl FnMut(&mut Value) -> Result<(), Error> + Send, Error> {
    place.check_merge_patch(patch)?;
    let patch = patch.clone();
    Ok(move |document: &mut Value| {
        json_patch::merge(document, &patch);
        Ok(())
    })
}

/// The edit of [`GuardedJson::patch_json`]: the JSON Patch `patch`, all or nothing.
pub(crate) fn patch_edit<T: Guarded, Col: Column>(
    place: Place<T, Col>,
    patch: &json_patch::Patch,
) -> impl FnMut(&mut Value) -> Result<(), Error> + Send {
    let patch = patch.clone();
    move |document: &mut Value| {
        json_patch::patch(document, &patch).map_err(|e| place.invalid(e.to_string()))
    }
}

/// The edit of [`GuardedJson::set_json`]: `value` at `pointer`.
pub(crate) fn set_edit<T: Guarded, Col: Column>(
    place: Place<T, Col>,
    pointer: &str,
    value: Value,
) -> Result<impl FnMut(&mut Value) -> Result<(), Error> + Send, Error> {
    let pointer = place.pointer(pointer)?;
    Ok(move |document: &mut Value| {
        place.check_path(document, &pointer)?;
        pointer
            .assign(document, value.clone())
            .map(drop)
            .map_err(|e| place.invalid(format!("cannot set {pointer}: {e}")))
    })
}

/// The edit of [`GuardedJson::remove_json`]: the value at `pointer`, if there.
pub(crate) fn remove_edit<T: Guarded, Col: Column>(
    place: Place<T, Col>,
    pointer: &str,
) -> Result<impl FnMut(&mut Value) -> Result<(), Error> + Send, Error> {
    let pointer = place.pointer(pointer)?;
    Ok(move |document: &mut Value| {
        place.check_path(document, &pointer)?;
        pointer.delete(document);
        Ok(())
    })
}

/// The edit of [`GuardedJson::update_json_as`]: `edit` on the document read as `D`,
/// written back as the merge patch of what it changed.
pub(crate) fn typed_edit<T, Col, D, R, E>(
    place: Place<T, Col>,
    mut edit: impl FnMut(&mut D) -> Result<R, E>,
) -> impl FnMut(&mut Value) -> Result<R, E>
where
    T: Guarded,
    Col: Column,
    D: Serialize + DeserializeOwned,
    E: From<Error>,
{
    move |document: &mut Value| {
        let mut typed: D = serde_json::from_value(document.clone()).map_err(|e| {
            place.unreadable(format!(
                "the document does not read as the typed struct: {e}"
            ))
        })?;
        let before = serde_json::to_value(&typed).map_err(|e| place.invalid(e.to_string()))?;
        let value = edit(&mut typed)?;
        let after = serde_json::to_value(&typed).map_err(|e| place.invalid(e.to_string()))?;
        if let Some(patch) = merge_diff(&before, &after) {
            json_patch::merge(document, &patch);
        }
        Ok(value)
    }
}

impl<T: Guarded + Clone> GuardedJson for T {}

/// The merge patch that turns `before` into `after` (RFC 7396): changed and new keys
/// with their values, removed keys as `null`, nested objects diffed key by key. `None`
/// when they are equal.
pub fn merge_diff(before: &Value, after: &Value) -> Option<Value> {
    match (before, after) {
        (Value::Object(before), Value::Object(after)) => {
            let mut patch = Map::new();
            for (key, old) in before {
                match after.get(key) {
                    None | Some(Value::Null) if !old.is_null() => {
                        patch.insert(key.clone(), Value::Null);
                    }
                    None | Some(Value::Null) => {}
                    Some(new) => {
                        if let Some(change) = merge_diff(old, new) {
                            patch.insert(key.clone(), change);
                        }
                    }
                }
            }
            for (key, new) in after {
                if !before.contains_key(key) && !new.is_null() {
                    patch.insert(key.clone(), new.clone());
                }
            }
            (!patch.is_empty()).then_some(Value::Object(patch))
        }
        _ if before == after => None,
        _ => Some(after.clone()),
    }
}

/// Why `value` (`what`) may not be a document: not an object (`rule` says why it must
/// be one), or over [`DOCUMENT_LIMIT_BYTES`] serialized.
fn object_refusal(value: &Value, what: &str, rule: &str) -> Option<String> {
    if !value.is_object() {
        return Some(format!("{rule}; {what} is {}", kind(value)));
    }
    let size = serde_json::to_vec(value)
        .map(|bytes| bytes.len())
        .unwrap_or(0);
    (size > DOCUMENT_LIMIT_BYTES)
        .then(|| format!("{what} has {size} bytes, over the limit of {DOCUMENT_LIMIT_BYTES}"))
}

/// Why the `#[occ(json)]` field `value` may not be written whole (a save, an insert, an
/// upsert): it is not an object. The derive's [`Guarded::unwritable_document`] asks this
/// of each such field. The size limit of edits is not applied here: a row's save must not
/// fail over a document it leaves as it was.
#[doc(hidden)]
pub fn document_refusal(value: &Value) -> Option<String> {
    (!value.is_object()).then(|| {
        format!(
            "an `#[occ(json)]` column holds a JSON object (every JSON edit of the row needs \
             one); the document is {}",
            kind(value)
        )
    })
}

/// [`Error::InvalidPatch`] when a field of `row` that is an `#[occ(json)]` document is not
/// one ([`Guarded::unwritable_document`]): checked before a save, insert or upsert of
/// `row` into `table` is sent.
pub(crate) fn refuse_unwritable<T: Guarded>(table: &'static str, row: &T) -> Result<(), Error> {
    match row.unwritable_document() {
        Some((column, reason)) => Err(Error::InvalidPatch {
            table,
            key: format!("{:?}", row.key()),
            column,
            reason,
        }),
        None => Ok(()),
    }
}

/// Where an edit applies, for its error messages: table, key (as written in messages)
/// and column. Owns what it names, so that an edit can go to another thread.
pub(crate) struct Place<T, Col> {
    table: &'static str,
    key: String,
    entity: std::marker::PhantomData<fn() -> (T, Col)>,
}

impl<T: Guarded, Col: Column> Place<T, Col> {
    pub(crate) fn new(table: &'static str, key: &T::Key) -> Self {
        Place {
            table,
            key: format!("{key:?}"),
            entity: std::marker::PhantomData,
        }
    }

    /// [`Error::InvalidPatch`] with `reason`.
    pub(crate) fn invalid(&self, reason: impl Into<String>) -> Error {
        Error::InvalidPatch {
            table: self.table,
            key: self.key.clone(),
            column: Col::NAME,
            reason: reason.into(),
        }
    }

    /// [`Error::InvalidData`] about the stored document.
    fn unreadable(&self, reason: impl std::fmt::Display) -> Error {
        Error::InvalidData {
            table: self.table,
            column: Col::NAME.to_string(),
            reason: format!("row {}: {reason}", self.key),
        }
    }

    /// The stored document is not an object.
    fn stored(&self, document: &Value) -> Error {
        self.unreadable(format!(
            "the document is {}, not a JSON object",
            kind(document)
        ))
    }

    /// A merge patch must be an object: another value would replace the whole document.
    pub(crate) fn check_merge_patch(&self, patch: &Value) -> Result<(), Error> {
        self.check_object(
            patch,
            "the patch",
            "a merge patch must be a JSON object (another value would replace the document)",
        )
    }

    /// The result must be an object within the size limit.
    fn check_result(&self, document: &Value) -> Result<(), Error> {
        self.check_object(document, "the result", "the edit must leave a JSON object")
    }

    /// `value` (`what`) is an object of at most [`DOCUMENT_LIMIT_BYTES`] serialized.
    fn check_object(&self, value: &Value, what: &str, rule: &str) -> Result<(), Error> {
        match object_refusal(value, what, rule) {
            Some(reason) => Err(self.invalid(reason)),
            None => Ok(()),
        }
    }

    /// `text` as a JSON pointer below the root.
    fn pointer(&self, text: &str) -> Result<json_patch::jsonptr::PointerBuf, Error> {
        let pointer = json_patch::jsonptr::Pointer::parse(text)
            .map_err(|e| self.invalid(format!("{text:?} is not a JSON pointer: {e}")))?;
        if pointer.is_root() {
            return Err(self.invalid("the pointer is the root; edit keys below it"));
        }
        Ok(pointer.to_buf())
    }

    /// Every existing value on the way to `pointer`'s parent is an object or an array.
    fn check_path(
        &self,
        document: &Value,
        pointer: &json_patch::jsonptr::Pointer,
    ) -> Result<(), Error> {
        let mut at = document;
        let mut walked = String::new();
        let tokens: Vec<_> = pointer.tokens().collect();
        for token in &tokens[..tokens.len().saturating_sub(1)] {
            let name = token.decoded();
            walked.push('/');
            walked.push_str(token.encoded());
            let next = match at {
                Value::Object(map) => map.get(name.as_ref()),
                Value::Array(items) => name.parse::<usize>().ok().and_then(|i| items.get(i)),
                other => {
                    return Err(self.invalid(format!(
                        "{pointer} goes through {}, which is {}",
                        walked,
                        kind(other)
                    )))
                }
            };
            match next {
                Some(value) => at = value,
                None => return Ok(()),
            }
        }
        match at {
            Value::Object(_) | Value::Array(_) => Ok(()),
            other => Err(self.invalid(format!(
                "{pointer} goes into {}, which is {}",
                if walked.is_empty() {
                    "the root"
                } else {
                    &walked
                },
                kind(other)
            ))),
        }
    }
}

/// "an array", "a string", ... for messages.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::merge_diff;
    use serde_json::json;

    #[test]
    fn the_diff_of_two_documents_merges_one_into_the_other() {
        let cases = [
            (
                json!({"a": 1, "b": {"c": 2, "d": 3}}),
                json!({"a": 1, "b": {"c": 5}, "e": [1]}),
            ),
            (json!({"a": {"b": 1}}), json!({"a": 2})),
            (json!({"a": 2}), json!({"a": {"b": 1}})),
            (json!({}), json!({})),
        ];
        for (before, after) in cases {
            let mut merged = before.clone();
            if let Some(patch) = merge_diff(&before, &after) {
                json_patch::merge(&mut merged, &patch);
            }
            assert_eq!(merged, after, "{before} -> {after}");
        }
        assert_eq!(merge_diff(&json!({"a": 1}), &json!({"a": 1})), None);
        assert_eq!(
            merge_diff(&json!({"a": 1}), &json!({"a": null})),
            Some(json!({"a": null}))
        );
    }
}
