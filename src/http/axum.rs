//! axum integration (feature `axum`): every outcome as a response, and the conditional
//! headers as extractors.
//!
//! A handler returns `Result<_, diesel_occ::Error>` (or [`Problem`], [`HttpError`]) and
//! `?` does the rest: a stale write is 412 with the current `ETag`, a missing row 404
//! (diesel's own `NotFound` too), a busy database 503 with `Retry-After`. [`IfMatch`] and
//! [`IfNoneMatch`] hand the client's tags to the handler, or refuse a malformed header
//! with 400 before it runs; the `headers` crate's `IfMatch` can only be asked whether a
//! tag matches, not which tags were sent.
//!
//! ```
//! use axum_core::response::IntoResponse;
//! use diesel_occ::http::{IfMatch, Precondition};
//! use diesel_occ::{Error, Token};
//!
//! // What a handler's `?` turns diesel's "no row" into.
//! let missing = Error::from(diesel::result::Error::NotFound).into_response();
//! assert_eq!(missing.status(), 404);
//!
//! // In a handler: `async fn put(IfMatch(sent): IfMatch, ...)`.
//! let sent = IfMatch(Precondition::Any);
//! assert!(sent.check(Some(&Token::Version(3)), true).is_ok());
//! ```

use std::ops::Deref;

use axum_core::extract::{FromRequest, FromRequestParts, Request};
use axum_core::response::{IntoResponse, Response};
use http::header::{HeaderValue, CONTENT_TYPE, ETAG};
use http::request::Parts;
use http::StatusCode;
use serde::Serialize;
use serde_json::Value;

use super::{check_precondition, EntityTag, HttpError, Precondition, Problem};
use crate::error::{Error, Token};
use crate::guard::{GuardKind, Guarded};

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        (self.status, self.headers(), self.body().to_string()).into_response()
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        Problem::from(&self).into_response()
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        Problem::from(&self).into_response()
    }
}

/// The request's `If-Match`: the tags the client sent (or `*`, or none). A malformed
/// header is refused with 400 before the handler runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfMatch(pub Precondition);

impl IfMatch {
    /// This `If-Match` against the row's current token (`None`: no such row), as
    /// [`check_if_match`](super::check_if_match) checks it: 428 when `required` and
    /// absent, 412 with the current tag when no tag matches.
    pub fn check(&self, current: Option<&Token>, required: bool) -> Result<(), HttpError> {
        check_precondition(&self.0, current, required)
    }
}

impl IfMatch {
    /// [`check`](Self::check) against `row`'s token: whatever the entity's guard kind,
    /// the tag the client holds is the one [`Tagged`] sent with the row.
    pub fn check_row<T: Guarded>(&self, row: &T, required: bool) -> Result<(), HttpError> {
        check_precondition(&self.0, Some(&T::Guard::describe(&row.token())), required)
    }
}

/// The precondition itself, for the writes pinned to it
/// (`merge_json_if_match(conn, &id, column, &patch, &if_match, &policy)`).
impl Deref for IfMatch {
    type Target = Precondition;

    fn deref(&self) -> &Precondition {
        &self.0
    }
}

/// The request's `If-None-Match`: the tags the client holds (or `*`, or none). A
/// malformed header is refused with 400 before the handler runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfNoneMatch(pub Precondition);

impl IfNoneMatch {
    /// Whether the representation with token `current` is new to the client (a `GET`
    /// answers it; otherwise 304 Not Modified).
    pub fn is_new(&self, current: Option<&Token>) -> bool {
        self.0.none_match(current)
    }
}

impl IfNoneMatch {
    /// The answer to a `GET` of `row`: 304 Not Modified with its `ETag` when the client
    /// holds its tag, else the row ([`Tagged`]).
    pub fn respond<T: Guarded + Serialize>(&self, row: T) -> Response {
        let token = T::Guard::describe(&row.token());
        if self.is_new(Some(&token)) {
            Tagged(row).into_response()
        } else {
            let tag = EntityTag::of(&token);
            (StatusCode::NOT_MODIFIED, [(ETAG, tag.header_value())]).into_response()
        }
    }
}

/// A row as a response: 200 with the row as a JSON body and its `ETag`, made from the
/// entity's guard ([`EntityTag::of_row`]); `(StatusCode::CREATED, Tagged(row))` answers 201.
/// The tag moves with every guarded write; a field written outside the guard (an
/// `#[occ(exclude)]` counter, a column a pre-image does not compare) does not move it, so
/// leave such fields out of the body (`#[serde(skip)]`) or a client holding the tag gets
/// 304 for a body that changed.
#[derive(Debug, Clone)]
pub struct Tagged<T>(pub T);

impl<T: Guarded + Serialize> IntoResponse for Tagged<T> {
    fn into_response(self) -> Response {
        let tag = EntityTag::of_row(&self.0);
        match serde_json::to_vec(&self.0) {
            Ok(body) => (
                [
                    (ETAG, tag.header_value()),
                    (CONTENT_TYPE, HeaderValue::from_static("application/json")),
                ],
                body,
            )
                .into_response(),
            Err(e) => Error::Json(e).into_response(),
        }
    }
}

/// The body of an HTTP `PATCH` of a JSON document, by its `Content-Type` (RFC 5789):
/// an RFC 7396 merge patch or an RFC 6902 JSON Patch. Refused before the handler runs
/// with a problem: 415 for another media type or none (naming the two in its
/// `Accept-Patch` header and the body's `accept_patch`), 400 for a body that is not JSON
/// or operations that do not parse, 422 for a merge patch that is not an object (it would
/// replace the whole document).
#[derive(Debug, Clone, PartialEq)]
pub enum PatchBody {
    /// `application/merge-patch+json`: a JSON object; `null` deletes a key.
    Merge(Value),
    /// `application/json-patch+json`: a list of operations, applied all or none.
    Operations(json_patch::Patch),
}

/// The media types of [`PatchBody`], as `Accept-Patch` lists them.
const ACCEPT_PATCH: &str = "application/merge-patch+json, application/json-patch+json";

impl<S: Send + Sync> FromRequest<S> for PatchBody {
    type Rejection = PatchRefused;

    async fn from_request(request: Request, state: &S) -> Result<Self, PatchRefused> {
        read_patch(request, state).await.map_err(PatchRefused)
    }
}

/// A refused PATCH body: its problem, answered with an `Accept-Patch` header naming the
/// patch formats taken (RFC 5789, 2.2).
#[derive(Debug, Clone, PartialEq)]
pub struct PatchRefused(pub Problem);

impl IntoResponse for PatchRefused {
    fn into_response(self) -> Response {
        let mut response = self.0.into_response();
        response.headers_mut().insert(
            http::header::HeaderName::from_static("accept-patch"),
            HeaderValue::from_static(ACCEPT_PATCH),
        );
        response
    }
}

/// The PATCH body of `request`, by its media type, or the problem that refuses it.
async fn read_patch<S: Send + Sync>(request: Request, state: &S) -> Result<PatchBody, Problem> {
    let media_type = request
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .map(|value| value.trim().to_ascii_lowercase());
    let merge = match media_type.as_deref() {
        Some("application/merge-patch+json") => true,
        Some("application/json-patch+json") => false,
        other => {
            let sent = other.map_or("no Content-Type".into(), |t| format!("type {t:?}"));
            let mut problem = Problem::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported-patch",
                format!("a PATCH body with {sent}: send {ACCEPT_PATCH}"),
            );
            problem
                .extensions
                .insert("accept_patch".into(), ACCEPT_PATCH.into());
            return Err(problem);
        }
    };
    let text = String::from_request(request, state)
        .await
        .map_err(|e| Problem::new(e.status(), "unreadable-body", e.body_text()))?;
    let body: Value = serde_json::from_str(&text).map_err(|e| {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "malformed-body",
            format!("the body is not JSON: {e}"),
        )
    })?;
    let unprocessable =
        |detail: String| Problem::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid-patch", detail);
    if merge {
        if !body.is_object() {
            return Err(unprocessable(
                "a merge patch must be a JSON object (another value would replace the \
                 whole document)"
                    .into(),
            ));
        }
        Ok(PatchBody::Merge(body))
    } else {
        // A body that is not a patch document is malformed (RFC 5789): 400.
        serde_json::from_value(body)
            .map(PatchBody::Operations)
            .map_err(|e| {
                Problem::new(
                    StatusCode::BAD_REQUEST,
                    "malformed-body",
                    format!("not a list of JSON Patch operations: {e}"),
                )
            })
    }
}

impl<S: Send + Sync> FromRequestParts<S> for IfMatch {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Problem> {
        Precondition::if_match(&parts.headers)
            .map(IfMatch)
            .map_err(|e| Problem::from(&e))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for IfNoneMatch {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Problem> {
        Precondition::if_none_match(&parts.headers)
            .map(IfNoneMatch)
            .map_err(|e| Problem::from(&e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::EntityTag;

    fn parts(headers: &[(&str, &str)]) -> Parts {
        let mut request = http::Request::builder();
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(()).unwrap().into_parts().0
    }

    fn extract<T: FromRequestParts<(), Rejection = Problem>>(
        headers: &[(&str, &str)],
    ) -> Result<T, Problem> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(T::from_request_parts(&mut parts(headers), &()))
    }

    #[test]
    fn the_extractors_hand_back_the_clients_tags() {
        let v3 = EntityTag::of(&Token::Version(3));
        let v4 = EntityTag::of(&Token::Version(4));
        let list = format!(
            "{}, {}",
            v3.header_value().to_str().unwrap(),
            v4.header_value().to_str().unwrap()
        );
        let IfMatch(sent) = extract::<IfMatch>(&[("if-match", &list)]).unwrap();
        assert_eq!(sent, Precondition::Tags(vec![v3.clone(), v4]));
        let sent = IfMatch(sent);
        assert!(sent.check(Some(&Token::Version(3)), true).is_ok());
        let stale = sent.check(Some(&Token::Version(5)), true).unwrap_err();
        assert_eq!(stale.into_response().status(), 412);

        let IfMatch(absent) = extract::<IfMatch>(&[]).unwrap();
        assert_eq!(absent, Precondition::Absent);
        let required = IfMatch(absent)
            .check(Some(&Token::Version(3)), true)
            .unwrap_err();
        assert_eq!(Problem::from(&required).status, 428);

        let held =
            extract::<IfNoneMatch>(&[("if-none-match", v3.header_value().to_str().unwrap())])
                .unwrap();
        assert!(!held.is_new(Some(&Token::Version(3))));
        assert!(held.is_new(Some(&Token::Version(4))));
    }

    #[test]
    fn a_malformed_header_is_refused_with_400() {
        for name in ["if-match", "if-none-match"] {
            let refused = if name == "if-match" {
                extract::<IfMatch>(&[(name, "not-a-tag")]).map(drop)
            } else {
                extract::<IfNoneMatch>(&[(name, "\"a\", *")]).map(drop)
            };
            let problem = refused.unwrap_err();
            assert_eq!(problem.status, 400, "{name}");
            let response = problem.into_response();
            assert_eq!(
                response.headers()["content-type"],
                "application/problem+json"
            );
        }
    }

    #[test]
    fn outcomes_become_responses() {
        let missing = Error::NotFound {
            table: "orders",
            key: "1".into(),
        }
        .into_response();
        assert_eq!(missing.status(), 404);
        // diesel's own `NotFound`, reaching the mapping through `?`, is a missing row too.
        let diesel_missing = Error::from(diesel::result::Error::NotFound).into_response();
        assert_eq!(diesel_missing.status(), 404);
        let busy = Error::Retryable {
            reason: crate::error::RetryReason::Deadlock,
            source: diesel::result::Error::RollbackTransaction,
        }
        .into_response();
        assert_eq!(busy.status(), 503);
        assert_eq!(busy.headers()["retry-after"], "1");
    }
}
