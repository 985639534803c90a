//! Edits of an entity's JSON document column: a read-merge-write with retry (the edit runs
//! on each attempt's fresh copy of the document), and the one-statement merge.

use std::marker::PhantomData;

use serde_json::Value;

use crate::error::Error;
use crate::guard::{Guarded, TokenOf};
use crate::json::document::Pin;
use crate::retry::RetryPolicy;

use super::modify::Modified;
use super::Operation;

/// An edit of a document, run on each attempt's copy.
pub(crate) type Edit<'e, R, E> = Box<dyn FnMut(&mut Value) -> Result<R, E> + Send + 'e>;

/// How an edit is made once the table's name is known: checked (a pointer, the shape of a
/// patch) before anything is sent, with the table and key in its errors.
type BuildEdit<'e, K, R, E> =
    Box<dyn FnOnce(&'static str, &K) -> Result<Edit<'e, R, E>, Error> + Send + 'e>;

/// A [`JsonEdit`] taken apart: the row's key, the policy, the pin and how the edit is made.
pub(crate) type EditParts<'e, K, R, E> = (K, RetryPolicy, Option<Pin>, BuildEdit<'e, K, R, E>);

/// Reads the row with `key`, runs an edit on the document in column `Col` and writes the
/// document back under the row's guard, each attempt on a fresh read, retried under
/// `policy`. Answers the row as written, its token and the edit's value (`R`).
pub struct JsonEdit<'e, T: Guarded, Col, R, E> {
    pub(crate) key: T::Key,
    pub(crate) policy: RetryPolicy,
    pin: Option<Pin>,
    build: BuildEdit<'e, T::Key, R, E>,
    column: PhantomData<fn() -> Col>,
}

impl<'e, T: Guarded, Col, R, E> JsonEdit<'e, T, Col, R, E> {
    /// The edit `build` makes of the document of the row with `key` (the blocking API
    /// edits with the caller's closure directly).
    #[cfg(feature = "async")]
    pub(crate) fn new(
        key: T::Key,
        policy: RetryPolicy,
        build: impl FnOnce(&'static str, &T::Key) -> Result<Edit<'e, R, E>, Error> + Send + 'e,
    ) -> Self {
        Self {
            key,
            policy,
            pin: None,
            build: Box::new(build),
            column: PhantomData,
        }
    }

    /// The edit made only of a row `pin` accepts.
    #[cfg(all(feature = "async", feature = "http"))]
    pub(crate) fn pinned(mut self, pin: Option<Pin>) -> Self {
        self.pin = pin;
        self
    }

    /// The row's key, the policy, the pin and how the edit is made.
    pub(crate) fn into_parts(self) -> EditParts<'e, T::Key, R, E> {
        (self.key, self.policy, self.pin, self.build)
    }
}

impl<T: Guarded, Col, R, E: From<Error>> Operation for JsonEdit<'_, T, Col, R, E> {
    type Output = Modified<T, R>;
    type Error = E;
}

/// Merges an RFC 7396 patch into the document in column `Col` of the row with `key` and
/// advances the row's token, in one statement. Answers the new token.
pub struct JsonMerge<T: Guarded, Col> {
    pub(crate) key: T::Key,
    pub(crate) patch: Value,
    column: PhantomData<fn() -> Col>,
}

impl<T: Guarded, Col> JsonMerge<T, Col> {
    /// The merge of `patch` into the row with `key` (the blocking API merges by key
    /// directly).
    #[cfg(feature = "async")]
    pub(crate) fn new(key: T::Key, patch: Value) -> Self {
        Self {
            key,
            patch,
            column: PhantomData,
        }
    }

    /// The same merge without a read of the new token.
    #[cfg(feature = "async")]
    pub(crate) fn without_token(self) -> JsonMergeNoToken<T, Col> {
        JsonMergeNoToken(self)
    }
}

impl<T: Guarded, Col> Operation for JsonMerge<T, Col> {
    type Output = TokenOf<T>;
    type Error = Error;
}

/// [`JsonMerge`] without a read of the new token (MySQL spares a round trip). Answers
/// nothing.
pub struct JsonMergeNoToken<T: Guarded, Col>(pub(crate) JsonMerge<T, Col>);

impl<T: Guarded, Col> Operation for JsonMergeNoToken<T, Col> {
    type Output = ();
    type Error = Error;
}
