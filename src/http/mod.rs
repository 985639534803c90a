//! HTTP's own optimistic concurrency for web back ends (feature `http`), on the `http`
//! crate's types and no web framework: the server sends an `ETag` made from the row's
//! token, the client sends it back in `If-Match`, a stale write is answered 412
//! Precondition Failed, and a write without a precondition can be refused with 428
//! (RFC 9110, RFC 6585). Every outcome of the library maps to a status code and an
//! RFC 9457 problem body ([`Problem`]).
//!
//! A guarded write from a handler: read the row, [`check_if_match`] the request against
//! its token, then write with the token just read (`guarded_update_by_key`), so a row
//! that moves on in between is a conflict, answered 412 like a stale tag.
//!
//! ```
//! use diesel_occ::http::{check_if_match, EntityTag, Problem};
//! use diesel_occ::Token;
//! use http::{HeaderMap, HeaderValue, StatusCode};
//!
//! let current = Token::Version(3);
//! let etag = EntityTag::of(&current); // sent with the GET as `ETag`
//!
//! let mut request = HeaderMap::new();
//! request.insert("if-match", etag.header_value());
//! assert!(check_if_match(&request, Some(&current), true).is_ok());
//!
//! // A client that read version 2 sends its tag after the row moved on to 3.
//! request.insert("if-match", EntityTag::of(&Token::Version(2)).header_value());
//! let refused = check_if_match(&request, Some(&current), true).unwrap_err();
//! let problem = Problem::from(&refused);
//! assert_eq!(problem.status, StatusCode::PRECONDITION_FAILED);
//! assert_eq!(problem.headers()["etag"], etag.header_value());
//!
//! // No precondition at all, where the server requires one: 428.
//! let missing = check_if_match(&HeaderMap::new(), Some(&current), true).unwrap_err();
//! assert_eq!(Problem::from(&missing).status.as_u16(), 428);
//!
//! // A malformed header is a 400, never a panic.
//! request.insert("if-match", HeaderValue::from_static("not-a-tag"));
//! assert_eq!(Problem::from(&check_if_match(&request, Some(&current), true).unwrap_err()).status, StatusCode::BAD_REQUEST);
//! ```

#[cfg(feature = "axum")]
mod axum;
mod etag;
mod precondition;
mod problem;

#[cfg(feature = "axum")]
pub use axum::{IfMatch, IfNoneMatch, PatchBody, PatchRefused, Tagged};
pub use etag::EntityTag;
#[cfg(feature = "axum")]
use precondition::check_precondition;
pub use precondition::{check_if_match, Precondition};
pub use problem::Problem;

/// Why a conditional request is refused before any database work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpError {
    /// A conditional header (or a tag) does not parse: answer 400.
    #[error("malformed {header} header: {reason}")]
    Malformed {
        /// Which header (`If-Match`, `If-None-Match`) or `entity tag`.
        header: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The write needs an `If-Match` and the request has none: answer 428.
    #[error("this write needs an If-Match header with the ETag of the resource as last read")]
    PreconditionRequired,
    /// `If-Match` names no current tag: answer 412.
    #[error("the resource changed since it was read (If-Match does not match): read it again and re-apply the change")]
    PreconditionFailed {
        /// The current tag, if the resource exists.
        current: Option<EntityTag>,
    },
}
