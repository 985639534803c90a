//! Entity tags (RFC 9110, section 8.8.3) made from guard tokens.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest, Sha256};

use super::HttpError;
use crate::error::Token;
use crate::guard::{GuardKind, Guarded};

/// An entity tag: opaque text in quotes, strong (`"abc"`) or weak (`W/"abc"`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EntityTag {
    weak: bool,
    opaque: String,
}

impl EntityTag {
    /// The strong tag of a row holding `token`, for every guard kind: 32 hex digits of a
    /// SHA-256 of the token, so that it says nothing of the row (not its version count,
    /// not a pre-image's values) and is the same in every process and release. Tags are
    /// compared per resource, as HTTP compares them; two rows at the same version share a
    /// tag, which is harmless because each is sent for its own URL.
    pub fn of(token: &Token) -> Self {
        let canonical = match token {
            Token::Version(v) => format!("version:{v}"),
            Token::Timestamp(t) => format!("timestamp:{t}"),
            Token::PreImage(values) => format!("pre-image:{values}"),
            Token::RowVersion(xmin) => format!("xmin:{xmin}"),
            Token::RowValue(value) => format!("row-version:{value}"),
        };
        let digest = Sha256::digest(canonical.as_bytes());
        let opaque = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        EntityTag {
            weak: false,
            opaque,
        }
    }

    /// A strong tag with the given opaque text (no quotes), if it is valid tag text.
    pub fn strong(opaque: &str) -> Result<Self, HttpError> {
        check_opaque(opaque)?;
        Ok(EntityTag {
            weak: false,
            opaque: opaque.to_string(),
        })
    }

    /// A weak tag with the given opaque text (no quotes), if it is valid tag text.
    pub fn weak(opaque: &str) -> Result<Self, HttpError> {
        check_opaque(opaque)?;
        Ok(EntityTag {
            weak: true,
            opaque: opaque.to_string(),
        })
    }

    /// Whether this is a weak tag (`W/"..."`).
    pub fn is_weak(&self) -> bool {
        self.weak
    }

    /// The text between the quotes.
    pub fn opaque(&self) -> &str {
        &self.opaque
    }

    /// Strong comparison (`If-Match`): both strong and the same text.
    pub fn strong_eq(&self, other: &EntityTag) -> bool {
        !self.weak && !other.weak && self.opaque == other.opaque
    }

    /// Weak comparison (`If-None-Match`): the same text, weak or not.
    pub fn weak_eq(&self, other: &EntityTag) -> bool {
        self.opaque == other.opaque
    }

    /// The strong tag of `row`: [`of`](Self::of) its guard's token, whatever the guard
    /// kind (a version, a timestamp, a pre-image), so the tag follows the entity's guard.
    pub fn of_row<T: Guarded>(row: &T) -> Self {
        Self::of(&T::Guard::describe(&row.token()))
    }

    /// The tag as an `ETag` header value.
    pub fn header_value(&self) -> http::HeaderValue {
        http::HeaderValue::from_str(&self.to_string())
            .expect("tag text is checked to be visible ASCII or obs-text")
    }
}

impl fmt::Display for EntityTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.weak {
            f.write_str("W/")?;
        }
        write!(f, "\"{}\"", self.opaque)
    }
}

impl FromStr for EntityTag {
    type Err = HttpError;

    /// One tag, `"text"` or `W/"text"`, without surrounding whitespace.
    fn from_str(text: &str) -> Result<Self, HttpError> {
        let (weak, quoted) = match text.strip_prefix("W/") {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let opaque = quoted
            .strip_prefix('"')
            .and_then(|rest| rest.strip_suffix('"'))
            .filter(|_| quoted.len() >= 2)
            .ok_or_else(|| {
                malformed(format!(
                    "{text:?} is not an entity tag (\"...\" or W/\"...\")"
                ))
            })?;
        check_opaque(opaque)?;
        Ok(EntityTag {
            weak,
            opaque: opaque.to_string(),
        })
    }
}

/// `etagc = %x21 / %x23-7E / obs-text`: visible ASCII but `"`, or bytes from 0x80 (which
/// arrive here as the characters a header value decodes to).
fn check_opaque(opaque: &str) -> Result<(), HttpError> {
    match opaque
        .chars()
        .find(|&c| !(c == '\x21' || ('\x23'..='\x7e').contains(&c) || c >= '\u{80}'))
    {
        Some(bad) => Err(malformed(format!("an entity tag may not contain {bad:?}"))),
        None => Ok(()),
    }
}

fn malformed(reason: String) -> HttpError {
    HttpError::Malformed {
        header: "entity tag",
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `EntityTag::of(&Token::Version(0))`, pinned: changing it would break every tag
    /// clients hold.
    const PINNED_VERSION_0: &str = "\"c24a32d4f9f6af8689481db7908b5538\"";

    #[test]
    fn a_token_gives_a_stable_opaque_strong_tag() {
        let tag = EntityTag::of(&Token::Version(7));
        assert!(!tag.is_weak());
        assert_eq!(tag.opaque().len(), 32);
        assert_ne!(tag.opaque(), "7");
        assert_eq!(tag, EntityTag::of(&Token::Version(7)));
        assert_ne!(tag, EntityTag::of(&Token::Version(8)));
        assert_ne!(tag, EntityTag::of(&Token::RowVersion(7)));
        // The same text in every release: a tag sent yesterday still matches today.
        assert_eq!(
            EntityTag::of(&Token::Version(0)).to_string(),
            PINNED_VERSION_0
        );
    }

    #[test]
    fn tags_round_trip_through_their_text() {
        for text in ["\"abc\"", "W/\"abc\"", "\"\"", "W/\"\"", "\"a-b_c/1!\""] {
            let tag: EntityTag = text.parse().unwrap();
            assert_eq!(tag.to_string(), text);
        }
        let of = EntityTag::of(&Token::PreImage("(\"Ada\", 3)".into()));
        assert_eq!(of.to_string().parse::<EntityTag>().unwrap(), of);
    }

    #[test]
    fn malformed_tags_are_errors_not_panics() {
        for text in [
            "abc",
            "\"abc",
            "abc\"",
            "\"",
            "W/abc",
            "w/\"abc\"",
            "\"a\"b\"",
            "\"a b\"",
            "\"a\tb\"",
            "",
        ] {
            assert!(text.parse::<EntityTag>().is_err(), "{text:?}");
        }
        assert!(EntityTag::strong("a\"b").is_err());
        assert!(EntityTag::weak("ok").unwrap().is_weak());
    }

    #[test]
    fn strong_and_weak_comparison_follow_rfc_9110() {
        let (w1, w1b, s1, s2) = (
            EntityTag::weak("1").unwrap(),
            EntityTag::weak("1").unwrap(),
            EntityTag::strong("1").unwrap(),
            EntityTag::strong("2").unwrap(),
        );
        assert!(!w1.strong_eq(&w1b) && w1.weak_eq(&w1b));
        assert!(!w1.strong_eq(&s1) && w1.weak_eq(&s1));
        assert!(s1.strong_eq(&s1.clone()) && !s1.weak_eq(&s2));
    }
}
