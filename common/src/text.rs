//! Text from recordings, peers and servers made safe to show on a terminal.
//!
//! A model name, a worker id, a file name or an error string can hold escape sequences that
//! set the window title, clear the screen, move the cursor or (through the bidirectional
//! overrides) reorder what the user reads. Everything printed to a terminal that did not come
//! from llm-replay itself goes through here first: every control character (C0, DEL, C1) and
//! every bidirectional override or isolate becomes a visible escape (`\x1b`, `\u{9b}`,
//! `\u{202e}`), so the text still says what it held and does nothing.

use std::borrow::Cow;

/// `text` with every control character shown as an escape, line feeds and tabs included:
/// for one field on one line (a model name, a worker id, a table cell).
pub fn escape_controls(text: &str) -> Cow<'_, str> {
    escape(text, false)
}

/// `text` with every control character shown as an escape except line feeds and tabs: for a
/// message or a rendering of several lines.
pub fn escape_controls_keep_lines(text: &str) -> Cow<'_, str> {
    escape(text, true)
}

/// True when `c` would be acted on by a terminal (or reorder the text) rather than shown.
pub fn is_unsafe_on_terminal(c: char) -> bool {
    c.is_control() || is_bidi_control(c)
}

/// The explicit bidirectional embeddings, overrides and isolates (U+202A-U+202E,
/// U+2066-U+2069) and the Arabic letter mark (U+061C).
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{061c}')
}

fn escape(text: &str, keep_lines: bool) -> Cow<'_, str> {
    let kept = |c: char| keep_lines && (c == '\n' || c == '\t');
    if !text.chars().any(|c| is_unsafe_on_terminal(c) && !kept(c)) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if !is_unsafe_on_terminal(c) || kept(c) {
            out.push(c);
        } else if c.is_ascii() {
            out.push_str(&format!("\\x{:02x}", u32::from(c)));
        } else {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_sequences_become_visible_text() {
        let hostile = "m\u{1b}]0;pwned\u{7}\u{1b}[2J\r\u{7f}\u{9b}31m\u{202e}x";
        let shown = escape_controls(hostile);
        assert_eq!(
            shown,
            "m\\x1b]0;pwned\\x07\\x1b[2J\\x0d\\x7f\\u{9b}31m\\u{202e}x"
        );
        assert!(!shown.chars().any(is_unsafe_on_terminal));
    }

    #[test]
    fn line_feeds_and_tabs_are_kept_only_when_asked() {
        assert_eq!(escape_controls("a\nb\tc"), "a\\x0ab\\x09c");
        assert_eq!(escape_controls_keep_lines("a\nb\tc\r"), "a\nb\tc\\x0d");
    }

    #[test]
    fn ordinary_text_is_borrowed_unchanged() {
        let text = "gpt-4o · 東京 · café ▲ — ok";
        assert!(matches!(escape_controls(text), Cow::Borrowed(t) if t == text));
    }
}
