//! Every outcome as an HTTP status and an RFC 9457 problem body.
//!
//! | outcome | status | why |
//! |---|---|---|
//! | `Conflict` (a stale token) | 412 | the client's `If-Match` (or the token it was read with) is stale: re-read and re-apply |
//! | no `If-Match` where one is required | 428 | RFC 6585: the server requires a conditional write |
//! | malformed conditional header | 400 | the request itself is wrong |
//! | `NotFound`, and diesel's own `NotFound` (a `.first()` behind `?`) | 404 | |
//! | `AlreadyExists` | 409 | an insert (a `PUT` that creates, a `POST` with a client key) found the key taken |
//! | `InvalidTransition` | 409 | the resource's state forbids the move; the body names the current state |
//! | `LockHeld`, `LockLost`, `StaleFence` | 409 | the resource is held by someone else; 423 is WebDAV's and clients rarely know it |
//! | `StatusNotWritable` | 409 | the representation changes the state, which only a transition (its own endpoint) may; the body names the column |
//! | `VersionOverflow` | 409 | the row cannot be written again until its column is widened |
//! | `InvalidPatch` | 422 | the patch is well-formed JSON that does not apply to the document |
//! | `InvalidName`, `InvalidSetting` | 400 | an input the client chose (a lock name) is refused |
//! | `RetriesExhausted`, `Retryable`, no pooled connection | 503 + `Retry-After: 1` | the row or the database is busy; a later try can succeed |
//! | `ReadOnly` | 503 + `Retry-After: 1` | the write reached a standby or replica; the primary (after a failover, the new one) takes it |
//! | `Ambiguous` | 500, no `Retry-After` | the write may have landed: the client must read before trying again |
//! | anything else | 500 | a server fault; the body says no more than that |

use std::time::Duration;

use http::header::{HeaderMap, HeaderValue, CONTENT_TYPE, ETAG, RETRY_AFTER};
use http::StatusCode;
use serde_json::{json, Map, Value};

use super::{EntityTag, HttpError};
use crate::error::Error;

/// An HTTP answer to a failed operation: status, problem body, and headers.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    /// The status code.
    pub status: StatusCode,
    /// A stable, machine-readable name of the outcome (`stale`, `not-found`, ...), also
    /// in the body as `code`.
    pub code: &'static str,
    /// What happened, for people.
    pub detail: String,
    /// How long a client should wait before trying again, when trying again can help.
    pub retry_after: Option<Duration>,
    /// The tag of the current representation, when the answer knows it (412).
    pub etag: Option<EntityTag>,
    /// Further members of the body (`current_state`, ...).
    pub extensions: Map<String, Value>,
}

impl Problem {
    pub(crate) fn new(status: StatusCode, code: &'static str, detail: impl Into<String>) -> Self {
        Problem {
            status,
            code,
            detail: detail.into(),
            retry_after: None,
            etag: None,
            extensions: Map::new(),
        }
    }

    /// The answer to a diesel-occ outcome (see the module's table). Server faults keep
    /// their details out of the body, which says only that the server failed.
    pub fn from_error(error: &Error) -> Self {
        use StatusCode as S;
        let busy = |code| {
            let mut p = Problem::new(S::SERVICE_UNAVAILABLE, code, error.to_string());
            p.retry_after = Some(Duration::from_secs(1));
            p
        };
        match error {
            Error::Conflict(conflict) => {
                let mut p = Problem::new(S::PRECONDITION_FAILED, "stale", error.to_string());
                p.etag = Some(EntityTag::of(&conflict.found));
                p
            }
            Error::NotFound { .. } => Problem::new(S::NOT_FOUND, "not-found", error.to_string()),
            // diesel's own "no row" (a `.first()` or `.get_result()` behind `?`) is a
            // missing resource too, not a server fault.
            Error::Database(diesel::result::Error::NotFound) => {
                Problem::new(S::NOT_FOUND, "not-found", "no such row")
            }
            Error::AlreadyExists { .. } => {
                Problem::new(S::CONFLICT, "already-exists", error.to_string())
            }
            Error::InvalidTransition(t) => {
                let mut p = Problem::new(S::CONFLICT, "invalid-transition", error.to_string());
                p.extensions.insert("current_state".into(), json!(t.from));
                p.extensions.insert("requested_state".into(), json!(t.to));
                p
            }
            Error::LockHeld { .. } => Problem::new(S::CONFLICT, "lock-held", error.to_string()),
            Error::LockLost { .. } => Problem::new(S::CONFLICT, "lock-lost", error.to_string()),
            Error::StaleFence { .. } => Problem::new(S::CONFLICT, "stale-fence", error.to_string()),
            Error::VersionOverflow { .. } => {
                Problem::new(S::CONFLICT, "version-overflow", error.to_string())
            }
            Error::StatusNotWritable { column, .. } => {
                let mut p = Problem::new(S::CONFLICT, "status-not-writable", error.to_string());
                p.extensions.insert("column".into(), json!(column));
                p
            }
            Error::InvalidPatch { .. } => {
                Problem::new(S::UNPROCESSABLE_ENTITY, "invalid-patch", error.to_string())
            }
            Error::InvalidName { .. } | Error::InvalidSetting { .. } => {
                Problem::new(S::BAD_REQUEST, "invalid-input", error.to_string())
            }
            Error::RetriesExhausted { .. } => busy("busy"),
            Error::Retryable { .. } => busy("busy"),
            Error::Pool(_) => busy("unavailable"),
            // A standby or replica took the write: in a failover the primary is back soon.
            Error::ReadOnly { .. } => busy("read-only"),
            Error::Precondition(refused) => Problem::from_http(refused),
            Error::Ambiguous { .. } => Problem::new(
                S::INTERNAL_SERVER_ERROR,
                "outcome-unknown",
                "the connection failed while the write was in flight; it may or may not have \
                 been applied: read the resource before trying again",
            ),
            _ => Problem::new(
                S::INTERNAL_SERVER_ERROR,
                "server-error",
                "the server failed",
            ),
        }
    }

    /// The answer to a refused conditional request.
    pub fn from_http(error: &HttpError) -> Self {
        use StatusCode as S;
        match error {
            HttpError::Malformed { .. } => {
                Problem::new(S::BAD_REQUEST, "malformed-header", error.to_string())
            }
            HttpError::PreconditionRequired => Problem::new(
                S::PRECONDITION_REQUIRED,
                "precondition-required",
                error.to_string(),
            ),
            HttpError::PreconditionFailed { current } => {
                let mut p = Problem::new(S::PRECONDITION_FAILED, "stale", error.to_string());
                p.etag = current.clone();
                p
            }
        }
    }

    /// The RFC 9457 body (`application/problem+json`): `type` `about:blank`, `title` the
    /// status's reason phrase, `status`, `detail`, `code`, and the extensions.
    pub fn body(&self) -> Value {
        let mut body = Map::new();
        body.insert("type".into(), json!("about:blank"));
        body.insert(
            "title".into(),
            json!(self.status.canonical_reason().unwrap_or("Error")),
        );
        body.insert("status".into(), json!(self.status.as_u16()));
        body.insert("detail".into(), json!(self.detail));
        body.insert("code".into(), json!(self.code));
        body.extend(self.extensions.clone());
        Value::Object(body)
    }

    /// The headers of the answer: `Content-Type: application/problem+json`, and
    /// `Retry-After` (seconds) and `ETag` when known.
    pub fn headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(wait) = self.retry_after {
            headers.insert(RETRY_AFTER, HeaderValue::from(wait.as_secs().max(1)));
        }
        if let Some(tag) = &self.etag {
            headers.insert(ETAG, tag.header_value());
        }
        headers
    }
}

impl From<&Error> for Problem {
    fn from(error: &Error) -> Self {
        Problem::from_error(error)
    }
}

impl From<&HttpError> for Problem {
    fn from(error: &HttpError) -> Self {
        Problem::from_http(error)
    }
}

/// A handler returning `Result<_, Problem>` can `?` the library's outcomes, refused
/// preconditions and diesel's own errors (its `NotFound` is 404) alike.
impl From<Error> for Problem {
    fn from(error: Error) -> Self {
        Problem::from_error(&error)
    }
}

impl From<HttpError> for Problem {
    fn from(error: HttpError) -> Self {
        Problem::from_http(&error)
    }
}

impl From<diesel::result::Error> for Problem {
    fn from(error: diesel::result::Error) -> Self {
        Problem::from_error(&Error::from(error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{Conflict, InvalidTransition, Token};

    #[test]
    fn every_outcome_has_its_status() {
        let cases: Vec<(Error, u16)> = vec![
            (
                Error::NotFound {
                    table: "orders",
                    key: "1".into(),
                },
                404,
            ),
            (
                Error::Conflict(Box::new(Conflict::new(
                    "orders",
                    "1".into(),
                    Token::Version(1),
                    Token::Version(2),
                    (),
                ))),
                412,
            ),
            (
                Error::InvalidTransition(Box::new(InvalidTransition::new(
                    "orders",
                    "1".into(),
                    "cancelled".into(),
                    "shipped".into(),
                    (),
                ))),
                409,
            ),
            (
                Error::LockHeld {
                    lock: "job".into(),
                    holder: None,
                    until: None,
                },
                409,
            ),
            (
                Error::RetriesExhausted {
                    attempts: 10,
                    last: Box::new(Error::NotFound {
                        table: "t",
                        key: "1".into(),
                    }),
                },
                503,
            ),
            (
                Error::InvalidSetting {
                    what: "ttl",
                    reason: "zero".into(),
                },
                400,
            ),
            (Error::Database(diesel::result::Error::NotFound), 404),
            (
                Error::Database(diesel::result::Error::RollbackTransaction),
                500,
            ),
        ];
        for (error, status) in cases {
            let problem = Problem::from_error(&error);
            assert_eq!(problem.status.as_u16(), status, "{error}");
            assert_eq!(problem.body()["status"], json!(status));
        }
    }

    #[test]
    fn a_stale_write_carries_the_current_tag_and_a_transition_the_current_state() {
        let stale = Error::Conflict(Box::new(Conflict::new(
            "orders",
            "1".into(),
            Token::Version(1),
            Token::Version(2),
            (),
        )));
        let problem = Problem::from_error(&stale);
        assert_eq!(problem.etag, Some(EntityTag::of(&Token::Version(2))));
        assert!(problem.headers().contains_key(ETAG));

        let refused = Error::InvalidTransition(Box::new(InvalidTransition::new(
            "orders",
            "1".into(),
            "cancelled".into(),
            "shipped".into(),
            (),
        )));
        let body = Problem::from_error(&refused).body();
        assert_eq!(
            (body["current_state"].as_str(), body["code"].as_str()),
            (Some("cancelled"), Some("invalid-transition"))
        );
    }

    #[test]
    fn busy_answers_say_when_to_try_again_and_faults_say_little() {
        let busy = Problem::from_error(&Error::Retryable {
            reason: crate::RetryReason::Deadlock,
            source: diesel::result::Error::NotFound,
        });
        assert_eq!(busy.headers()[RETRY_AFTER], "1");
        let fault =
            Problem::from_error(&Error::Database(diesel::result::Error::RollbackTransaction));
        assert_eq!(fault.detail, "the server failed");
        assert!(!fault.headers().contains_key(RETRY_AFTER));
        assert_eq!(fault.headers()[CONTENT_TYPE], "application/problem+json");
    }

    #[test]
    fn refused_preconditions_map_to_400_428_412() {
        let malformed = HttpError::Malformed {
            header: "If-Match",
            reason: "x".into(),
        };
        assert_eq!(
            Problem::from_http(&malformed).status,
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            Problem::from_http(&HttpError::PreconditionRequired)
                .status
                .as_u16(),
            428
        );
        assert_eq!(
            Problem::from_http(&HttpError::PreconditionFailed { current: None }).status,
            StatusCode::PRECONDITION_FAILED
        );
    }
}
