//! Text from outside (a file name, a lock's reason, an agent's error) as it may be shown
//! in a log line, an answer or a terminal: control characters escaped, so an ESC or a
//! newline cannot forge a line or move a cursor, and cut to a bound, saying how much
//! was left off, so a 5,000-character name cannot fill a log.

use std::fmt::Write as _;

/// `text` with every control character escaped (`\n`, `\u{1b}`) and at most
/// `max_chars` of its characters kept; what was cut is counted at the end.
pub fn shown(text: &str, max_chars: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max_chars.saturating_mul(4)));
    let mut chars = text.chars();
    for (kept, c) in chars.by_ref().enumerate() {
        if kept == max_chars {
            let rest = 1 + chars.count();
            let _ = write!(out, "… ({rest} more characters)");
            return out;
        }
        if c.is_control() {
            let _ = write!(out, "{}", c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// `text` cut to at most `max_chars` characters at the end of a word, with `…` where it
/// was cut: for a reason a person reads (a halt's, an agent's error in a list). A
/// word longer than a few characters (a URL) is cut inside it.
pub fn cut_at_word(text: &str, max_chars: usize) -> String {
    let text = text.trim_end();
    if text.chars().count() <= max_chars {
        return text.to_owned();
    }
    let keep = max_chars.saturating_sub(1);
    let end = text.char_indices().nth(keep).map_or(text.len(), |(i, _)| i);
    let head = &text[..end];
    // The next character decides whether the last word was whole.
    let whole = text[end..].starts_with(char::is_whitespace);
    // A long token (a URL, a path) is cut inside rather than dropped whole: what it
    // starts with says more than nothing.
    const LONGEST_WORD_DROPPED: usize = 24;
    let cut = if whole {
        head
    } else {
        match head.rfind(char::is_whitespace) {
            Some(space) if space > 0 && head.len() - space <= LONGEST_WORD_DROPPED => {
                &head[..space]
            }
            _ => head,
        }
    };
    format!(
        "{}…",
        cut.trim_end_matches(|c: char| c.is_whitespace() || c == ',' || c == ';')
    )
}

/// `text` cut to at most `max_bytes` bytes at a character boundary (nothing escaped):
/// for a field a peer bounds by size.
pub fn cut_to_bytes(text: &str, max_bytes: usize) -> &str {
    if text.len() <= max_bytes {
        return text;
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// An error with every cause under it, `outer: inner: innermost`: a transport error's
/// own text is often only "error sending request", its reason two causes down.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        message = format!("{message}: {s}");
        source = s.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_is_cut_after_a_whole_word() {
        assert_eq!(cut_at_word("short", 10), "short");
        assert_eq!(
            cut_at_word("the disk is full, try again", 14),
            "the disk is…"
        );
        assert_eq!(cut_at_word("the disk is full", 12), "the disk is…");
        assert_eq!(cut_at_word("abcdefghijkl", 5), "abcd…");
        let url = format!("see http://{}/x", "h".repeat(60));
        assert!(cut_at_word(&url, 30).starts_with("see http://hhh"));
        assert!(cut_at_word(&"word ".repeat(100), 160).chars().count() <= 160);
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(shown("a\u{1b}[2Jb\nc", 100), "a\\u{1b}[2Jb\\nc");
        assert_eq!(shown("plain", 100), "plain");
    }

    #[test]
    fn long_text_is_cut_and_says_how_much() {
        let long = "x".repeat(5000);
        let s = shown(&long, 100);
        assert!(s.starts_with(&"x".repeat(100)));
        assert!(s.ends_with("(4900 more characters)"), "{s}");
        assert_eq!(shown(&"é".repeat(10), 10), "é".repeat(10));
    }

    #[test]
    fn bytes_are_cut_at_a_character_boundary() {
        assert_eq!(cut_to_bytes("héllo", 2), "h");
        assert_eq!(cut_to_bytes("héllo", 3), "hé");
        assert_eq!(cut_to_bytes("hi", 10), "hi");
    }
}
