//! Lenient, borrowing JSON field types shared by the family parsers.
//!
//! Servers disagree on types at the edges (`content: null`, a number where a string was
//! expected, an array of parts instead of a string), and one odd field must not make a whole
//! frame unparseable. These types accept any JSON value, keep what they understand, and skip
//! the rest without allocating (`IgnoredAny`). Strings borrow from the frame buffer unless they
//! contain JSON escapes, in which case serde_json has to unescape into an owned `String`.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::FrameError;

/// A JSON value kept only when it is a string; anything else (null, numbers, objects) is `None`.
#[derive(Debug, Default)]
pub(crate) struct Text<'a>(pub(crate) Option<Cow<'a, str>>);

impl<'a> Text<'a> {
    /// The string when present and non-empty.
    pub(crate) fn non_empty(self) -> Option<Cow<'a, str>> {
        self.0.filter(|text| !text.is_empty())
    }

    /// The string as a `&str`, empty when absent.
    pub(crate) fn as_str(&self) -> &str {
        self.0.as_deref().unwrap_or("")
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TextVisitor<'a>(PhantomData<&'a ()>);

        impl<'de: 'a, 'a> Visitor<'de> for TextVisitor<'a> {
            type Value = Text<'a>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Text(Some(Cow::Borrowed(v))))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                // Only reached for strings with escapes: serde_json had to unescape them.
                Ok(Text(Some(Cow::Owned(v.to_owned()))))
            }
            fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
                Ok(Text(Some(Cow::Owned(v))))
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(Text(None))
            }
            fn visit_none<E>(self) -> Result<Self::Value, E> {
                Ok(Text(None))
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                Text::deserialize(d)
            }
            fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Text(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                Ok(Text(None))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                Ok(Text(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Text(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                drain_seq(seq)?;
                Ok(Text(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                drain_map(map)?;
                Ok(Text(None))
            }
        }

        deserializer.deserialize_any(TextVisitor(PhantomData))
    }
}

/// A token count: a non-negative JSON number, anything else is `None`.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Count(pub(crate) Option<u64>);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct CountVisitor;

        impl<'de> Visitor<'de> for CountVisitor {
            type Value = Count;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a token count")
            }
            fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
                Ok(Count(Some(v)))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
                Ok(Count(u64::try_from(v).ok()))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
                // Some Python servers send `12.0`; truncation of a whole float is exact.
                let whole = v.is_finite() && v >= 0.0 && v <= u64::MAX as f64;
                Ok(Count(whole.then_some(v as u64)))
            }
            fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
                Ok(Count(None))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Count(None))
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(Count(None))
            }
            fn visit_none<E>(self) -> Result<Self::Value, E> {
                Ok(Count(None))
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                Count::deserialize(d)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                drain_seq(seq)?;
                Ok(Count(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                drain_map(map)?;
                Ok(Count(None))
            }
        }

        deserializer.deserialize_any(CountVisitor)
    }
}

/// Consume the rest of a JSON array without keeping anything.
pub(crate) fn drain_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

/// Consume the rest of a JSON object without keeping anything.
pub(crate) fn drain_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

/// The message of an `error` member when it is truthy in the Python sense (the openai SDK's
/// test: `if data.get("error")`): not null, false, 0, `""`, `[]` or `{}`.
///
/// Error path only, so it may allocate: it parses the raw value into a `serde_json::Value`.
pub(crate) fn truthy_error_message(raw: &RawValue) -> Option<Cow<'static, str>> {
    let value: serde_json::Value = serde_json::from_str(raw.get()).ok()?;
    let truthy = match &value {
        serde_json::Value::Null => false,
        serde_json::Value::Bool(b) => *b,
        serde_json::Value::Number(n) => n.as_f64() != Some(0.0),
        serde_json::Value::String(s) => !s.is_empty(),
        serde_json::Value::Array(a) => !a.is_empty(),
        serde_json::Value::Object(o) => !o.is_empty(),
    };
    if !truthy {
        return None;
    }
    Some(Cow::Owned(describe_error(&value)))
}

/// A human-readable message for an error value: its `message`, else its `type`/`code`, else
/// the JSON itself.
pub(crate) fn describe_error(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Object(o) => {
            for key in ["message", "type", "code"] {
                if let Some(serde_json::Value::String(s)) = o.get(key)
                    && !s.is_empty()
                {
                    return s.clone();
                }
            }
            value.to_string()
        }
        other => other.to_string(),
    }
}

/// Parse one frame's JSON, mapping a failure to [`FrameError::Malformed`].
pub(crate) fn parse<'a, T: Deserialize<'a>>(
    family: &'static str,
    json: &'a [u8],
) -> Result<T, FrameError> {
    // UTF-8 checked once for the whole frame (an ASCII fast path): serde_json then borrows
    // every string without checking each again. A frame that is not UTF-8 takes the byte
    // parser, which judges it exactly as before.
    let parsed = match std::str::from_utf8(json) {
        Ok(text) => serde_json::from_str(text),
        Err(_) => serde_json::from_slice(json),
    };
    parsed.map_err(|error| FrameError::Malformed {
        family,
        // Error path: allocating the reason is fine.
        reason: format!("frame is not the expected JSON: {error}"),
    })
}

/// `bytes` without leading and trailing ASCII whitespace.
pub(crate) fn trim(bytes: &[u8]) -> &[u8] {
    bytes.trim_ascii()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize)]
    struct Probe<'a> {
        #[serde(default, borrow)]
        text: Text<'a>,
        #[serde(default)]
        count: Count,
    }

    #[test]
    fn text_borrows_unescaped_strings_and_owns_escaped_ones() {
        let probe: Probe = serde_json::from_slice(br#"{"text":"plain"}"#).expect("valid JSON");
        assert!(matches!(probe.text.0, Some(Cow::Borrowed("plain"))));
        let probe: Probe =
            serde_json::from_slice(br#"{"text":"\u003cthink\u003e"}"#).expect("valid");
        assert!(matches!(probe.text.0, Some(Cow::Owned(ref s)) if s == "<think>"));
    }

    #[test]
    fn text_and_count_tolerate_other_types() {
        let probe: Probe =
            serde_json::from_slice(br#"{"text":[{"type":"text","text":"x"}],"count":"12"}"#)
                .expect("valid JSON");
        assert!(probe.text.0.is_none());
        assert!(probe.count.0.is_none());
        let probe: Probe = serde_json::from_slice(br#"{"text":null,"count":12.0}"#).expect("ok");
        assert!(probe.text.0.is_none());
        assert_eq!(probe.count.0, Some(12));
        let probe: Probe = serde_json::from_slice(br#"{"count":-1}"#).expect("ok");
        assert_eq!(probe.count.0, None);
    }

    #[test]
    fn truthiness_of_error_members() {
        let raw = |s: &str| RawValue::from_string(s.to_owned()).expect("valid JSON");
        assert_eq!(truthy_error_message(&raw("null")), None);
        assert_eq!(truthy_error_message(&raw("{}")), None);
        assert_eq!(truthy_error_message(&raw("\"\"")), None);
        assert_eq!(truthy_error_message(&raw("false")), None);
        assert_eq!(
            truthy_error_message(&raw(r#"{"message":"boom","type":"server_error"}"#)).as_deref(),
            Some("boom")
        );
        assert_eq!(
            truthy_error_message(&raw(r#""oops""#)).as_deref(),
            Some("oops")
        );
    }
}
