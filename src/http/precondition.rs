//! `If-Match` and `If-None-Match` (RFC 9110, sections 13.1.1 and 13.1.2), parsed from a
//! request's headers and evaluated against a row's current token.

use http::header::{HeaderMap, HeaderName, IF_MATCH, IF_NONE_MATCH};

use super::{EntityTag, HttpError};
use crate::error::{Error, Token};
use crate::json::document::Pin;

/// What a conditional header asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Precondition {
    /// The header is absent.
    Absent,
    /// `*`: any current representation.
    Any,
    /// A list of entity tags.
    Tags(Vec<EntityTag>),
}

impl Precondition {
    /// The request's `If-Match`: all its fields, as one list. A malformed value is
    /// [`HttpError::Malformed`] (answer 400), never a panic.
    pub fn if_match(headers: &HeaderMap) -> Result<Self, HttpError> {
        parse(headers, IF_MATCH, "If-Match")
    }

    /// The request's `If-None-Match`, parsed as [`if_match`](Self::if_match) parses.
    pub fn if_none_match(headers: &HeaderMap) -> Result<Self, HttpError> {
        parse(headers, IF_NONE_MATCH, "If-None-Match")
    }

    /// Whether this precondition is absent.
    pub fn is_absent(&self) -> bool {
        matches!(self, Precondition::Absent)
    }

    /// This precondition, where a write needs one: absent, it is
    /// [`HttpError::PreconditionRequired`] (answer 428).
    pub fn required(&self) -> Result<&Self, HttpError> {
        if self.is_absent() {
            Err(HttpError::PreconditionRequired)
        } else {
            Ok(self)
        }
    }

    /// The check a write pinned to this `If-Match` makes of the row it read: none when
    /// absent, else [`Error::Precondition`] with the current tag when it does not hold.
    pub(crate) fn pin(&self) -> Option<Pin> {
        if self.is_absent() {
            return None;
        }
        let precondition = self.clone();
        Some(Box::new(move |current: &Token| {
            check_precondition(&precondition, Some(current), false).map_err(Error::from)
        }))
    }

    /// `If-Match` evaluated for a resource whose current token is `current` (`None`: it
    /// does not exist): `*` holds when it exists, a list when one of its tags is the
    /// current tag by strong comparison (so a weak tag never holds), and an absent header
    /// always holds.
    pub fn matches(&self, current: Option<&Token>) -> bool {
        match self {
            Precondition::Absent => true,
            Precondition::Any => current.is_some(),
            Precondition::Tags(tags) => current.is_some_and(|token| {
                let current = EntityTag::of(token);
                tags.iter().any(|tag| tag.strong_eq(&current))
            }),
        }
    }

    /// `If-None-Match` evaluated for a resource whose current token is `current`: `*`
    /// holds when it does not exist, a list when none of its tags is the current tag by
    /// weak comparison, and an absent header always holds. When it does not hold, a GET
    /// answers 304 Not Modified and a write 412.
    pub fn none_match(&self, current: Option<&Token>) -> bool {
        match self {
            Precondition::Absent => true,
            Precondition::Any => current.is_none(),
            Precondition::Tags(tags) => current.is_none_or(|token| {
                let current = EntityTag::of(token);
                !tags.iter().any(|tag| tag.weak_eq(&current))
            }),
        }
    }
}

/// Checks a write's `If-Match` against the row's current token (`None`: no such row),
/// before the guarded write that then carries that token: [`HttpError::Malformed`] for a
/// header that does not parse (400), [`HttpError::PreconditionRequired`] when `required`
/// and the header is absent (428), [`HttpError::PreconditionFailed`] with the current tag
/// when it does not match (412). A row that changes between this check and the write
/// makes the write a conflict, which [`Problem`](super::Problem) also answers with 412.
pub fn check_if_match(
    headers: &HeaderMap,
    current: Option<&Token>,
    required: bool,
) -> Result<(), HttpError> {
    check_precondition(&Precondition::if_match(headers)?, current, required)
}

/// [`check_if_match`] for an `If-Match` already parsed.
pub(crate) fn check_precondition(
    precondition: &Precondition,
    current: Option<&Token>,
    required: bool,
) -> Result<(), HttpError> {
    if required && precondition.is_absent() {
        return Err(HttpError::PreconditionRequired);
    }
    if precondition.matches(current) {
        Ok(())
    } else {
        Err(HttpError::PreconditionFailed {
            current: current.map(EntityTag::of),
        })
    }
}

fn parse(
    headers: &HeaderMap,
    name: HeaderName,
    label: &'static str,
) -> Result<Precondition, HttpError> {
    let malformed = |reason: String| HttpError::Malformed {
        header: label,
        reason,
    };
    let mut tags = Vec::new();
    let mut any = false;
    let mut fields = 0;
    for value in headers.get_all(&name) {
        fields += 1;
        let text = value
            .to_str()
            .map_err(|_| malformed("the value is not visible ASCII".into()))?;
        for element in split_list(text).map_err(malformed)? {
            if element == "*" {
                any = true;
            } else {
                tags.push(element.parse::<EntityTag>().map_err(|e| match e {
                    HttpError::Malformed { reason, .. } => malformed(reason),
                    other => other,
                })?);
            }
        }
    }
    match (fields, any, tags.is_empty()) {
        (0, _, _) => Ok(Precondition::Absent),
        (_, true, true) => Ok(Precondition::Any),
        (_, true, false) => Err(malformed("`*` cannot be listed with entity tags".into())),
        (_, false, true) => Err(malformed("the list is empty".into())),
        (_, false, false) => Ok(Precondition::Tags(tags)),
    }
}

/// The elements of a comma-separated list (`#` rule): commas inside quotes belong to the
/// tag, empty elements are skipped, whitespace around elements is dropped.
fn split_list(text: &str) -> Result<Vec<&str>, String> {
    let mut elements = Vec::new();
    let (mut start, mut quoted) = (0, false);
    for (i, c) in text.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => {
                elements.push(text[start..i].trim_matches([' ', '\t']));
                start = i + 1;
            }
            _ => {}
        }
    }
    if quoted {
        return Err(format!("an unclosed quote in {text:?}"));
    }
    elements.push(text[start..].trim_matches([' ', '\t']));
    Ok(elements.into_iter().filter(|e| !e.is_empty()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(name: HeaderName, values: &[&str]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for v in values {
            map.append(name.clone(), HeaderValue::from_str(v).unwrap());
        }
        map
    }

    fn tag(token: &Token) -> String {
        EntityTag::of(token).to_string()
    }

    #[test]
    fn if_match_lists_weak_tags_and_star() {
        let (v1, v2) = (Token::Version(1), Token::Version(2));
        let current = Some(&v1);
        let list = headers(IF_MATCH, &[&format!("\"x\", {} ,", tag(&v2)), &tag(&v1)]);
        assert!(Precondition::if_match(&list).unwrap().matches(current));
        let stale = headers(IF_MATCH, &[&tag(&v2)]);
        assert!(!Precondition::if_match(&stale).unwrap().matches(current));
        let weak = headers(IF_MATCH, &[&format!("W/{}", tag(&v1))]);
        assert!(
            !Precondition::if_match(&weak).unwrap().matches(current),
            "weak never matches"
        );
        let star = Precondition::if_match(&headers(IF_MATCH, &["*"])).unwrap();
        assert!(star.matches(current) && !star.matches(None));
        assert!(!Precondition::if_match(&list).unwrap().matches(None));
        assert!(Precondition::if_match(&HeaderMap::new())
            .unwrap()
            .matches(None));
    }

    #[test]
    fn if_none_match_uses_weak_comparison() {
        let v1 = Token::Version(1);
        let weak =
            Precondition::if_none_match(&headers(IF_NONE_MATCH, &[&format!("W/{}", tag(&v1))]))
                .unwrap();
        assert!(!weak.none_match(Some(&v1)));
        assert!(weak.none_match(Some(&Token::Version(2))));
        assert!(weak.none_match(None));
        let star = Precondition::if_none_match(&headers(IF_NONE_MATCH, &["*"])).unwrap();
        assert!(star.none_match(None) && !star.none_match(Some(&v1)));
    }

    #[test]
    fn check_if_match_gives_428_412_or_ok() {
        let v1 = Token::Version(1);
        assert_eq!(
            check_if_match(&HeaderMap::new(), Some(&v1), true),
            Err(HttpError::PreconditionRequired)
        );
        assert_eq!(check_if_match(&HeaderMap::new(), Some(&v1), false), Ok(()));
        assert_eq!(
            check_if_match(&headers(IF_MATCH, &["\"old\""]), Some(&v1), true),
            Err(HttpError::PreconditionFailed {
                current: Some(EntityTag::of(&v1))
            })
        );
        assert_eq!(
            check_if_match(&headers(IF_MATCH, &[&tag(&v1)]), Some(&v1), true),
            Ok(())
        );
    }

    #[test]
    fn malformed_headers_are_400_class_errors() {
        for bad in [
            "abc",
            "\"a",
            "*, \"a\"",
            ",",
            " , ",
            "W/abc",
            "\"a\" \"b\"",
            "\"a,b",
        ] {
            let err = Precondition::if_match(&headers(IF_MATCH, &[bad])).unwrap_err();
            assert!(
                matches!(
                    err,
                    HttpError::Malformed {
                        header: "If-Match",
                        ..
                    }
                ),
                "{bad:?}: {err:?}"
            );
        }
        let mut map = HeaderMap::new();
        map.insert(IF_MATCH, HeaderValue::from_bytes(b"\"\xff\"").unwrap());
        assert!(Precondition::if_match(&map).is_err());
    }
}
