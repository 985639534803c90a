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

use super::run::AsyncRun;
use crate::drive::on_async::connection::{NativeAsync, NativeAsyncConnection};
use crate::drive::on_async::send::AsyncLoadByKey;
use crate::drive::on_async::Caller;
use crate::drive::read_modify_write::read_modify_write;
use crate::drive::{Io, ReadOn, RunOn};
use crate::error::Error;
use crate::flow::miss::RowMoved;
use crate::guard::{AdvanceInSql, Guarded, ReturnedTokenOf, TokenOf};
use crate::json::document::{
    merge_edit, patch_edit, remove_edit, set_edit, suspects, typed_edit, EditDocument,
    JsonDocument, Place, SetDocument,
};
use crate::json::merge_in_place::{merge_completed, MergeInPlaceOf};
use crate::operation::json::Edit;
use crate::operation::{JsonEdit, JsonMerge, JsonMergeNoToken, Operation, Update};
use crate::retry::RetryPolicy;
use crate::sql::new_token::Counted;
use crate::sql::statement::Assignments;
use crate::write::entity::token_read_back;
use crate::write::modify::Modified;

/// Edits of JSON columns on a diesel-async connection: read-merge-write with retry
/// ([`GuardedJson`](crate::GuardedJson)) and one-statement merges
/// ([`GuardedJsonMerge`](crate::GuardedJsonMerge)); see there for what each does and
/// answers.
pub trait AsyncGuardedJson: Guarded {
    /// Runs `edit` on the document of column `Col` of the row with `key`, read fresh on
    /// every attempt, and writes the result under the row's guard.
    fn edit_json<'e, C, Col, F, R, E>(
        conn: &mut C,
        key: &Self::Key,
        column: Col,
        policy: &RetryPolicy,
        edit: F,
    ) -> impl Future<Output = Result<Modified<Self, R>, E>> + Send
    where
        Col: Column,
        F: FnMut(&mut Value) -> Result<R, E> + Send + 'e,
        E: From<Error>,
        JsonEdit<'e, Self, Col, R, E>: AsyncRun<C>,
    {
        let _ = column;
        let build = move |_: &'static str, _: &Self::Key| Ok(Box::new(edit) as Edit<'e, R, E>);
        JsonEdit::new(key.clone(), policy.clone(), build).run_async(conn)
    }

    /// Applies the RFC 7396 merge `patch` to the document of column `Col`.
    fn merge_json<C, Col>(
        conn: &mut C,
        key: &Self::Key,
        column: Col,
        patch: &Value,
        policy: &RetryPolicy,
    ) -> impl Future<Output = Result<Modified<Self, ()>, Error>> + Send
    where
        Col: Column + 'static,
        JsonEdit<'static, Self, Col, (), Error>: AsyncRun<C>,
    {
        let patch = patch.clone();
        edit_built(conn, key, column, policy, move |place| {
            Ok(Box::new(merge_edit(place, &patch)?))
        })
    }

    /// Applies the RFC 6902 JSON Patch `patch` to the document of column `Col`, all
    /// operations or none.
    fn patch_json<C, Col>(
        conn: &mut C,
        key: &Self::Key,
        column: Col,
        patch: &json_patch::Patch,
        policy: &RetryPolicy,
    ) -> impl Future<Output = Result<Modified<Self, ()>, Error>> + Send
    where
        Col: Column + 'static,
        JsonEdit<'static, Self, Col, (), Error>: AsyncRun<C>,
    {
        let patch = patch.clone();
        edit_built(conn, key, column, policy, move |place| {
            Ok(Box::new(patch_edit(place, &patch)))
        })
    }

    /// [`merge_json`](Self::merge_json) pinned to a request's `If-Match` (feature
    /// `http`); see [`GuardedJson::merge_json_if_match`](crate::GuardedJson::merge_json_if_match).
    #[cfg(feature = "http")]
    fn merge_json_if_match<C, Col>(
        conn: &mut C,
        key: &Self::Key,
        column: Col,
        patch: &Value,
        if_match: &crate::http::Precondition,
        policy: &RetryPolicy,
    ) -> impl Future<Output = Result<Modified<Self, ()>, Error>> + Send
    where
        Col: Column + 'static,
        JsonEdit<'static, Self, Col, (), Error>: AsyncRun<C>,
    {
        let patch = patch.clone();
        let build = move |table: &'static str, key: &Self::Key| {
            Ok(
                Box::new(merge_edit(Place::<Self, Col>::new(table, key), &patch)?)
                    as Edit<'static, (), Error>,
            )
        };
        let _ = column;
        JsonEdit::new(key.clone(), policy.clone(), build)
            .pinned(if_match.pin())
            .run_async(conn)
    }

    /// [`patch_json`](Self::patch_json) pinned to a request's `If-Match` (feature
    /// `http`); see [`GuardedJson::merge_json_if_match`](crate::GuardedJson::merge_json_if_match).
    #[cfg(feature = "http")]
    fn patch_json_if_match<C, Col>(
        conn: &mut C,
        key: &Self::Key,
        column: Col,
        patch: &json_patch::Patch,
        if_match: &crate::http::Precondition,
        policy: &RetryPolicy,
    ) -> impl Future<Output = Result<Modified<Self, ()>, Error>> + Send
    where
        Col: Column + 'static,
        JsonEdit<'static, Self, Col, (), Error>: AsyncRun<C>,
    {
        let patch = patch.clone();
        let build = move |table: &'static str, key: &Self::Key| {
            Ok(
                Box::new(patch_edit(Place::<Self, Col>::new(table, key), &patch))
                    as Edit<'static, (), Error>,
            )
        };
        let _ = column;
        JsonEdit::new(key.clone(), policy.clone(), build)
            .pinned(if_match.pin())
            .run_async(conn)
    }

    /// Sets the value at the RFC 6901 `pointer` of the document of column `Col`.
    fn set_json<C, Col>(
        conn: &mut C,
        key: &Self::Key,
        column: Col,
        pointer: &str,
        value: Value,
        policy: &RetryPolicy,
    ) -> impl Future<Output = Result<Modified<Self, ()>, Error>> + Send
    where
        Col: Column + 'static,
        JsonEdit<'static, Self, Col, (), Error>: AsyncRun<C>,
    {
        let pointer = pointer.to_owned();
        edit_built(conn, key, column, policy, move |place| {
            Ok(Box::new(set_edit(place, &pointer, value)?))
        })
    }

    /// Removes the value at the RFC 6901 `pointer` of the document of column `Col`.
    fn remove_json<C, Col>(
        conn: &mut C,
        key: &Self::Key,
        column: Col,
        pointer: &str,
        policy: &RetryPolicy,
    ) -> impl Future<Output = Result<Modified<Self, ()>, Error>> + Send
    where
        Col: Column + 'static,
        JsonEdit<'static, Self, Col, (), Error>: AsyncRun<C>,
    {
        let pointer = pointer.to_owned();
        edit_built(conn, key, column, policy, move |place| {
            Ok(Box::new(remove_edit(place, &pointer)?))
        })
    }

    /// Runs `edit` on the document of column `Col` read as the typed struct `D`, and
    /// writes back only what it changed; see
    /// [`GuardedJson::update_json_as`](crate::GuardedJson::update_json_as).
    fn update_json_as<'e, D, C, Col, F, R, E>(
        conn: &mut C,
        key: &Self::Key,
        column: Col,
        policy: &RetryPolicy,
        edit: F,
    ) -> impl Future<Output = Result<Modified<Self, R>, E>> + Send
    where
        D: Serialize + DeserializeOwned + 'e,
        Col: Column + 'e,
        F: FnMut(&mut D) -> Result<R, E> + Send + 'e,
        R: 'e,
        E: From<Error> + 'e,
        JsonEdit<'e, Self, Col, R, E>: AsyncRun<C>,
    {
        let _ = column;
        let build = move |table: &'static str, key: &Self::Key| {
            let place = Place::<Self, Col>::new(table, key);
            Ok(Box::new(typed_edit(place, edit)) as Edit<'e, R, E>)
        };
        JsonEdit::new(key.clone(), policy.clone(), build).run_async(conn)
    }

    /// Merges the RFC 7396 `patch` into the document of column `Col` of the row with
    /// `key` and advances the row's token, in one statement (no read, no retry). Returns
    /// the new token; see
    /// [`GuardedJsonMerge::merge_json_in_place`](crate::GuardedJsonMerge::merge_json_in_place).
    fn merge_json_in_place<C, Col>(
        conn: &mut C,
        key: &Self::Key,
        column: Col,
        patch: &Value,
    ) -> impl Future<Output = Result<TokenOf<Self>, Error>> + Send
    where
        Self::Guard: AdvanceInSql,
        JsonMerge<Self, Col>: AsyncRun<C>,
    {
        let _ = column;
        JsonMerge::new(key.clone(), patch.clone()).run_async(conn)
    }

    /// [`merge_json_in_place`](Self::merge_json_in_place) without reading the new token
    /// back; see [`GuardedJsonMerge::merge_json_in_place_without_token`](crate::GuardedJsonMerge::merge_json_in_place_without_token).
    fn merge_json_in_place_without_token<C, Col>(
        conn: &mut C,
        key: &Self::Key,
        column: Col,
        patch: &Value,
    ) -> impl Future<Output = Result<(), Error>> + Send
    where
        Self::Guard: AdvanceInSql,
        JsonMergeNoToken<Self, Col>: AsyncRun<C>,
    {
        let _ = column;
        JsonMerge::new(key.clone(), patch.clone())
            .without_token()
            .run_async(conn)
    }
}

impl<T: Guarded> AsyncGuardedJson for T {}

/// Runs the edit `build` makes (checked before anything is sent) of the document in
/// column `Col`.
fn edit_built<'a, T, C, Col, B>(
    conn: &'a mut C,
    key: &T::Key,
    column: Col,
    policy: &RetryPolicy,
    build: B,
) -> impl Future<Output = Result<Modified<T, ()>, Error>> + Send + 'a
where
    T: Guarded,
    Col: Column + 'static,
    B: FnOnce(Place<T, Col>) -> Result<Edit<'static, (), Error>, Error> + Send + 'static,
    JsonEdit<'static, T, Col, (), Error>: AsyncRun<C>,
{
    let _ = column;
    let build = move |table: &'static str, key: &T::Key| build(Place::new(table, key));
    JsonEdit::new(key.clone(), policy.clone(), build).run_async(conn)
}

impl<'e, T, C, Col, R, E> AsyncRun<C> for JsonEdit<'e, T, Col, R, E>
where
    T: JsonDocument<Col> + AsyncLoadByKey<C> + Clone,
    Update<T, SetDocument<Col>>: AsyncRun<C>,
    C: NativeAsyncConnection + 'static,
    C::Backend: NativeAsync,
    Col: Column + Send + 'static,
    R: Send + 'static,
    E: From<Error> + Send + 'static,
{
    async fn run_async(
        self,
        conn: &mut C,
    ) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        let (key, policy, pin, build) = self.into_parts();
        let table = <T as AsyncLoadByKey<C>>::table_name();
        // Checked before anything is sent.
        let edit = build(table, &key)?;
        let place = Place::<T, Col>::new(table, &key);
        let step = EditDocument { place, pin, edit };
        read_modify_write(Caller(conn), &key, &policy, &suspects::<T, Col>(), step).await
    }
}

impl<T, C, Col> AsyncRun<C> for JsonMerge<T, Col>
where
    T: JsonDocument<Col> + ReadOn<C>,
    T::Guard: AdvanceInSql,
    C: Io + NativeAsyncConnection,
    Col: Column + Send + 'static,
    MergeInPlaceOf<T, Col>: Assignments<<C as Io>::Backend> + Send,
    for<'k> ReturnedTokenOf<T>: RunOn<C, MergeInPlaceOf<T, Col>, RowMoved<'k, T>, TokenOf<T>>,
{
    async fn run_async(
        self,
        conn: &mut C,
    ) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        let merge = merge_completed::<ReturnedTokenOf<T>, T, C, Col>;
        token_read_back(merge(conn, &self.key, &self.patch).await?)
    }
}

impl<T, C, Col> AsyncRun<C> for JsonMergeNoToken<T, Col>
where
    T: JsonDocument<Col> + ReadOn<C>,
    T::Guard: AdvanceInSql,
    C: Io + NativeAsyncConnection,
    Col: Column + Send + 'static,
    MergeInPlaceOf<T, Col>: Assignments<<C as Io>::Backend> + Send,
    for<'k> Counted: RunOn<C, MergeInPlaceOf<T, Col>, RowMoved<'k, T>, TokenOf<T>>,
{
    async fn run_async(
        self,
        conn: &mut C,
    ) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        let JsonMergeNoToken(merge) = self;
        merge_completed::<Counted, T, C, Col>(conn, &merge.key, &merge.patch)
            .await
            .map(drop)
    }
}
