//! Text read from files made safe to show on a terminal.
//!
//! A GGUF's metadata, a manifest's tensor names, a path, even the vocabulary a model generates
//! from, can hold control characters: an escape sequence that retitles the window, clears the
//! screen or rewrites what was printed before. Every line this program prints goes through
//! [`printable`] (the crate's `say!` and `tell!` macros, and the progress bars' messages).
//! JSON output needs nothing: serde escapes control characters in strings.

use std::borrow::Cow;

/// `text` with every control character except newline and tab (C0, DEL, C1) and every
/// bidirectional override written as its escape (`\u{1b}`), so it cannot drive the terminal or
/// reorder what is shown.
pub fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return text.into();
    }
    text.chars()
        .map(|c| {
            if needs_escape(c) {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect::<String>()
        .into()
}

fn needs_escape(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t')
        || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_what_drives_a_terminal_and_keeps_the_rest() {
        assert_eq!(printable("a\tb\nc"), "a\tb\nc");
        assert_eq!(printable("x\u{1b}]0;t\u{7}"), "x\\u{1b}]0;t\\u{7}");
        assert_eq!(printable("\r\u{9b}\u{7f}"), "\\u{d}\\u{9b}\\u{7f}");
        assert_eq!(printable("a\u{202e}b"), "a\\u{202e}b");
        assert_eq!(printable("tête"), "tête");
    }
}
