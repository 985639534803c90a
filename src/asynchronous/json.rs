//! JSON document columns on diesel-async connections: the blocking
//! [`GuardedJson`](crate::GuardedJson) (read-merge-write with retry, never dropping a
//! concurrent writer's keys) and [`GuardedJsonMerge`](crate::GuardedJsonMerge) (one
//! statement), as futures. The edits, their rules and their outcomes are the blocking
//! path's own.

use std::future::Future;

use diesel::Column;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use diesel_async::AsyncConnection;

use super::connection::{in_transaction, refuse_broken, NativeAsync, NativeAsyncConnection};
use super::entity::write_by_key_completed;
use super::modify::{modify_with, Caller, Step};
use super::run::AsyncRun;
use super::send::{AsyncComplete, AsyncLoadByKey};
use super::transaction::Call;
use crate::error::Error;
use crate::guard::{AdvanceInSql, Guarded, ReturnedTokenOf, TokenOf};
use crate::json::document::{
    edited, merge_edit, patch_edit, remove_edit, set_edit, suspects, typed_edit, Edited,
    JsonDocument, Place, SetDocument,
};
use crate::json::merge_in_place::{MergeInPlaceOf, MergePatch};
use crate::op::Update;
use crate::retry::{RetryPolicy, Stop};
use crate::sql::new_token::Counted;
use crate::sql::statement::{Assignments, Unguarded};
use crate::write::entity::{token_read_back, RowMoved};
use crate::write::modify::Modified;

/// An edit of a document as the async variants hand it over: owned, so that it can go to
/// SQLite's connection thread.
pub type BoxedEdit<R, E> = Box<dyn FnMut(&mut Value) -> Result<R, E> + Send>;

/// Read-merge-write edits of JSON columns on a diesel-async connection; see
/// [`GuardedJson`](crate::GuardedJson) for what each does and answers.
pub trait AsyncGuardedJson: Guarded + Clone {
    /// Runs `edit` on the document of column `Col` of the row with `key`, read fresh on
    /// every attempt, and writes the result under the row's guard.
    fn edit_json<'a, C, Col, F, R, E>(
        conn: &'a mut C,
        key: &'a Self::Key,
        column: Col,
        policy: &'a RetryPolicy,
        edit: F,
    ) -> impl Future<Output = Result<Modified<Self, R>, E>> + Send + 'a
    where
        Col: Column,
        Self: AsyncEditJson<C, Col, F, R, E>,
        F: FnMut(&mut Value) -> Result<R, E> + 'a,
    {
        let _ = column;
        Self::edit_document(conn, key, policy, edit)
    }

    /// Applies the RFC 7396 merge `patch` to the document of column `Col`.
    fn merge_json<'a, C, Col>(
        conn: &'a mut C,
        key: &'a Self::Key,
        column: Col,
        patch: &Value,
        policy: &'a RetryPolicy,
    ) -> impl Future<Output = Result<Modified<Self, ()>, Error>> + Send + 'a
    where
        Col: Column + 'static,
        Self: AsyncEditJson<C, Col, BoxedEdit<(), Error>, (), Error>,
        C: Send,
    {
        let edit = merge_edit(
            Place::<Self, Col>::new(
                <Self as AsyncEditJson<C, Col, BoxedEdit<(), Error>, (), Error>>::table_name(),
                key,
            ),
            patch,
        );
        edit_with(conn, key, column, policy, edit)
    }

    /// Applies the RFC 6902 JSON Patch `patch` to the document of column `Col`, all
    /// operations or none.
    fn patch_json<'a, C, Col>(
        conn: &'a mut C,
        key: &'a Self::Key,
        column: Col,
        patch: &json_patch::Patch,
        policy: &'a RetryPolicy,
    ) -> impl Future<Output = Result<Modified<Self, ()>, Error>> + Send + 'a
    where
        Col: Column + 'static,
        Self: AsyncEditJson<C, Col, BoxedEdit<(), Error>, (), Error>,
        C: Send,
    {
        let edit = patch_edit(
            Place::<Self, Col>::new(
                <Self as AsyncEditJson<C, Col, BoxedEdit<(), Error>, (), Error>>::table_name(),
                key,
            ),
            patch,
        );
        edit_with(conn, key, column, policy, Ok(edit))
    }

    /// Sets the value at the RFC 6901 `pointer` of the document of column `Col`.
    fn set_json<'a, C, Col>(
        conn: &'a mut C,
        key: &'a Self::Key,
        column: Col,
        pointer: &str,
        value: Value,
        policy: &'a RetryPolicy,
    ) -> impl Future<Output = Result<Modified<Self, ()>, Error>> + Send + 'a
    where
        Col: Column + 'static,
        Self: AsyncEditJson<C, Col, BoxedEdit<(), Error>, (), Error>,
        C: Send,
    {
        let edit = set_edit(
            Place::<Self, Col>::new(
                <Self as AsyncEditJson<C, Col, BoxedEdit<(), Error>, (), Error>>::table_name(),
                key,
            ),
            pointer,
            value,
        );
        edit_with(conn, key, column, policy, edit)
    }

    /// Removes the value at the RFC 6901 `pointer` of the document of column `Col`.
    fn remove_json<'a, C, Col>(
        conn: &'a mut C,
        key: &'a Self::Key,
        column: Col,
        pointer: &str,
        policy: &'a RetryPolicy,
    ) -> impl Future<Output = Result<Modified<Self, ()>, Error>> + Send + 'a
    where
        Col: Column + 'static,
        Self: AsyncEditJson<C, Col, BoxedEdit<(), Error>, (), Error>,
        C: Send,
    {
        let edit = remove_edit(
            Place::<Self, Col>::new(
                <Self as AsyncEditJson<C, Col, BoxedEdit<(), Error>, (), Error>>::table_name(),
                key,
            ),
            pointer,
        );
        edit_with(conn, key, column, policy, edit)
    }

    /// Runs `edit` on the document of column `Col` read as the typed struct `D`, and
    /// writes back only what it changed; see
    /// [`GuardedJson::update_json_as`](crate::GuardedJson::update_json_as). The edit is
    /// owned (`Send + 'static`).
    fn update_json_as<'a, D, C, Col, R, E>(
        conn: &'a mut C,
        key: &'a Self::Key,
        column: Col,
        policy: &'a RetryPolicy,
        edit: impl FnMut(&mut D) -> Result<R, E> + Send + 'static,
    ) -> impl Future<Output = Result<Modified<Self, R>, E>> + Send + 'a
    where
        D: Serialize + DeserializeOwned + 'static,
        Col: Column + 'static,
        Self: AsyncEditJson<C, Col, BoxedEdit<R, E>, R, E>,
        R: 'static,
        E: From<Error> + 'static,
    {
        let table = <Self as AsyncEditJson<C, Col, BoxedEdit<R, E>, R, E>>::table_name();
        let edit = typed_edit(Place::<Self, Col>::new(table, key), edit);
        let _ = column;
        Self::edit_document(conn, key, policy, Box::new(edit) as BoxedEdit<R, E>)
    }
}

impl<T: Guarded + Clone> AsyncGuardedJson for T {}

/// Runs a built edit (or the error of building it, with nothing sent).
fn edit_with<'a, T, C, Col, F>(
    conn: &'a mut C,
    key: &'a T::Key,
    column: Col,
    policy: &'a RetryPolicy,
    edit: Result<F, Error>,
) -> impl Future<Output = Result<Modified<T, ()>, Error>> + Send + 'a
where
    T: AsyncEditJson<C, Col, BoxedEdit<(), Error>, (), Error>,
    C: Send,
    F: FnMut(&mut Value) -> Result<(), Error> + Send + 'static,
{
    let _ = column;
    let edit = edit.map(|edit| Box::new(edit) as BoxedEdit<(), Error>);
    async move { T::edit_document(conn, key, policy, edit?).await }
}

/// A read-merge-write edit `F` of the document in column `Col` of entity `Self` on async
/// connection `C`, as one bound; not a trait to implement.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot edit the JSON document in `{Col}` on `{C}` with this edit",
    note = "the column must be the entity's `#[occ(json)]` field and the connection a diesel-async connection of a backend diesel-occ supports; the edit, its value and its error must be `Send` (and `'static` on SQLite, whose connection runs the call on its own thread)"
)]
pub trait AsyncEditJson<C, Col, F, R, E>: JsonDocument<Col> + Clone {
    /// Runs the edit.
    #[doc(hidden)]
    fn edit_document<'a>(
        conn: &'a mut C,
        key: &'a Self::Key,
        policy: &'a RetryPolicy,
        edit: F,
    ) -> impl Future<Output = Result<Modified<Self, R>, E>> + Send + 'a
    where
        F: 'a;

    /// The table's SQL name, for messages.
    #[doc(hidden)]
    fn table_name() -> &'static str;
}

/// The step of an edit: `edit` on the document as read, written back under the guard
/// when it changed anything.
struct EditDocument<T, Col, F> {
    place: Place<T, Col>,
    edit: F,
}

impl<T, C, Col, F, R, E> Step<T, C, R, E> for EditDocument<T, Col, F>
where
    T: JsonDocument<Col> + Clone,
    Update<T, SetDocument<Col>>: AsyncRun<C>,
    C: AsyncConnection,
    Col: Column + Send + 'static,
    F: FnMut(&mut Value) -> Result<R, E> + Send,
    R: Send + 'static,
    E: Send + 'static,
{
    async fn apply<'a>(
        &'a mut self,
        conn: &'a mut C,
        original: &'a T,
    ) -> Result<(T, TokenOf<T>, R), Stop<E>> {
        match edited(&self.place, original, &mut self.edit)? {
            Edited::Unchanged(done) => Ok(done),
            Edited::Write(document, stamp, record) => {
                let (key, expected) = (original.key(), original.token());
                let update = Update::new(key, expected, document).stamped(stamp);
                let token = update
                    .owned_transaction(true)
                    .run_async(conn)
                    .await
                    .map_err(Stop::Occ)?;
                Ok(record.written(token))
            }
        }
    }
}

impl<T, C, Col, F, R, E> AsyncEditJson<C, Col, F, R, E> for T
where
    T: JsonDocument<Col> + AsyncLoadByKey<C> + Clone,
    Update<T, SetDocument<Col>>: AsyncRun<C>,
    C: NativeAsyncConnection + 'static,
    C::Backend: NativeAsync,
    Col: Column + Send + 'static,
    F: FnMut(&mut Value) -> Result<R, E> + Send,
    R: Send + 'static,
    E: From<Error> + Send + 'static,
{
    async fn edit_document<'a>(
        conn: &'a mut C,
        key: &'a T::Key,
        policy: &'a RetryPolicy,
        edit: F,
    ) -> Result<Modified<T, R>, E>
    where
        F: 'a,
    {
        refuse_broken(conn)?;
        let nested = in_transaction(conn);
        let place = Place::<T, Col>::new(<T as AsyncLoadByKey<C>>::table_name(), key);
        let step = EditDocument { place, edit };
        modify_with(
            Caller(Some(conn)),
            nested,
            key,
            policy,
            &suspects::<T, Col>(),
            step,
        )
        .await
    }

    fn table_name() -> &'static str {
        <T as AsyncLoadByKey<C>>::table_name()
    }
}

/// One-statement JSON merges on a diesel-async connection; see
/// [`GuardedJsonMerge`](crate::GuardedJsonMerge).
pub trait AsyncGuardedJsonMerge: Guarded
where
    Self::Guard: AdvanceInSql,
{
    /// Merges the RFC 7396 `patch` into the document of column `Col` of the row with
    /// `key` and advances the row's token, in one statement. Returns the new token.
    fn merge_json_in_place<'a, C, Col>(
        conn: &'a mut C,
        key: &'a Self::Key,
        column: Col,
        patch: &Value,
    ) -> impl Future<Output = Result<TokenOf<Self>, Error>> + Send + 'a
    where
        Self: AsyncMergeInPlace<C, Col>,
    {
        let _ = column;
        Self::merge_in_place(conn, key, patch)
    }

    /// [`merge_json_in_place`](Self::merge_json_in_place) without reading the new token
    /// back; see [`GuardedJsonMerge::merge_json_in_place_without_token`](crate::GuardedJsonMerge::merge_json_in_place_without_token).
    fn merge_json_in_place_without_token<'a, C, Col>(
        conn: &'a mut C,
        key: &'a Self::Key,
        column: Col,
        patch: &Value,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'a
    where
        Self: AsyncMergeInPlace<C, Col>,
    {
        let _ = column;
        Self::merge_in_place_without_token(conn, key, patch)
    }
}

impl<T> AsyncGuardedJsonMerge for T
where
    T: Guarded,
    T::Guard: AdvanceInSql,
{
}

/// The one-statement merge into column `Col` of entity `Self` on async connection `C`,
/// as one bound; not a trait to implement.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot merge into `{Col}` in one statement on `{C}`",
    note = "the column must be the entity's `#[occ(json)]` field, the connection a diesel-async connection of a backend diesel-occ supports, and the guard must advance in SQL (not a pre-image)"
)]
pub trait AsyncMergeInPlace<C, Col>: JsonDocument<Col> {
    /// Runs the merge.
    #[doc(hidden)]
    fn merge_in_place<'a>(
        conn: &'a mut C,
        key: &'a Self::Key,
        patch: &Value,
    ) -> impl Future<Output = Result<TokenOf<Self>, Error>> + Send + 'a;

    /// Runs the merge without reading the new token back.
    #[doc(hidden)]
    fn merge_in_place_without_token<'a>(
        conn: &'a mut C,
        key: &'a Self::Key,
        patch: &Value,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'a;
}

impl<T, C, Col> AsyncMergeInPlace<C, Col> for T
where
    T: JsonDocument<Col> + AsyncLoadByKey<C>,
    T::Guard: AdvanceInSql,
    C: NativeAsyncConnection,
    C::Backend: NativeAsync,
    Col: Column + Send + 'static,
    MergeInPlaceOf<T, Col>: Assignments<C::Backend> + Send,
    ReturnedTokenOf<T>: AsyncComplete<C, MergeInPlaceOf<T, Col>, TokenOf<T>>,
    Counted: AsyncComplete<C, MergeInPlaceOf<T, Col>, TokenOf<T>>,
{
    fn merge_in_place<'a>(
        conn: &'a mut C,
        key: &'a T::Key,
        patch: &Value,
    ) -> impl Future<Output = Result<TokenOf<T>, Error>> + Send + 'a {
        let merged = merge_completed::<ReturnedTokenOf<T>, T, C, Col>(conn, key, patch);
        async move { token_read_back(merged.await?) }
    }

    fn merge_in_place_without_token<'a>(
        conn: &'a mut C,
        key: &'a T::Key,
        patch: &Value,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'a {
        let merged = merge_completed::<Counted, T, C, Col>(conn, key, patch);
        async move { merged.await.map(drop) }
    }
}

/// The checked patch merged by one statement run and completed by `Done`.
fn merge_completed<'a, Done, T, C, Col>(
    conn: &'a mut C,
    key: &'a T::Key,
    patch: &Value,
) -> impl Future<Output = Result<Option<TokenOf<T>>, Error>> + Send + 'a
where
    T: JsonDocument<Col> + AsyncLoadByKey<C>,
    T::Guard: AdvanceInSql,
    C: NativeAsyncConnection,
    C::Backend: NativeAsync,
    Col: Column + Send + 'static,
    MergeInPlaceOf<T, Col>: Assignments<C::Backend> + Send,
    Done: AsyncComplete<C, MergeInPlaceOf<T, Col>, TokenOf<T>>,
{
    let checked = Place::<T, Col>::new(<T as AsyncLoadByKey<C>>::table_name(), key)
        .check_merge_patch(patch)
        .map(|()| patch.clone());
    async move {
        refuse_broken(conn)?;
        let miss = RowMoved::<T>::advancing_any(key, T::Guard::at_end);
        let changes = MergePatch::<Col>::new(checked?);
        // Dropped half way (on MySQL, a reply half read, or the version noted and not yet
        // read back), the call marks the connection broken.
        let mut call = Call::start(conn);
        let merge = write_by_key_completed::<Done, T, C, _, _, _>;
        let merged = merge(call.conn(), key, changes, Unguarded, miss, 0).await;
        call.finish(merged)
    }
}
