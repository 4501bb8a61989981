//! The byte-level spelling used by GPT-2 style vocabularies (Qwen2 among them).
//!
//! Every byte is written as one printable character, so that a vocabulary of strings can hold
//! arbitrary bytes: printable Latin-1 bytes stand for themselves and the other 68 (controls,
//! space, DEL, NBSP, soft hyphen) are shifted, in byte order, to U+0100 and up.

/// Whether `byte` is written as the character with the same code point.
const fn is_self_spelled(byte: u8) -> bool {
    matches!(byte, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// `SPELLING[b]` is the character that stands for byte `b`.
pub(crate) const SPELLING: [char; 256] = {
    let mut table = ['\0'; 256];
    let mut shifted = 0u32;
    let mut b = 0usize;
    while b < 256 {
        let code = if is_self_spelled(b as u8) {
            b as u32
        } else {
            shifted += 1;
            0x100 + shifted - 1
        };
        table[b] = match char::from_u32(code) {
            Some(c) => c,
            None => panic!("byte spelling is always a valid char"),
        };
        b += 1;
    }
    table
};

// 188 bytes spell themselves, so the shifted ones end at U+0143.
const _: () = assert!(SPELLING[b' ' as usize] as u32 == 0x120);
const _: () = assert!(SPELLING[0xAD] as u32 == 0x143);

/// Number of bytes that are not self-spelled and so use U+0100 and up.
const SHIFTED: usize = 68;

/// `UNSHIFT[i]` is the byte spelled as U+0100 + i.
const UNSHIFT: [u8; SHIFTED] = {
    let mut table = [0u8; SHIFTED];
    let mut n = 0;
    let mut b = 0usize;
    while b < 256 {
        if !is_self_spelled(b as u8) {
            table[n] = b as u8;
            n += 1;
        }
        b += 1;
    }
    assert!(n == SHIFTED);
    table
};

/// The byte a spelling character stands for, if it is one.
pub(crate) fn byte_of(c: char) -> Option<u8> {
    let code = c as u32;
    if code < 0x100 {
        let b = code as u8;
        return is_self_spelled(b).then_some(b);
    }
    UNSHIFT.get((code - 0x100) as usize).copied()
}

/// Appends the bytes a vocabulary entry decodes to and says whether it is byte-spelled: the
/// spelled bytes when every character is a spelling, else the entry's own UTF-8 (added tokens
/// such as `<|im_end|>` are plain text, which for ASCII punctuation and letters is the same
/// thing). One pass serves both the decoding table and the check of normal tokens.
pub(crate) fn push_token_bytes(token: &str, out: &mut Vec<u8>) -> bool {
    let start = out.len();
    for c in token.chars() {
        match byte_of(c) {
            Some(b) => out.push(b),
            None => {
                out.truncate(start);
                out.extend_from_slice(token.as_bytes());
                return false;
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    // Internals: the table is private to the crate.
    use super::*;

    #[test]
    fn every_byte_has_a_distinct_spelling_that_maps_back() {
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let c = SPELLING[b as usize];
            assert!(seen.insert(c), "{c:?} spelled twice");
            assert_eq!(byte_of(c), Some(b));
        }
        assert_eq!(byte_of(' '), None);
        assert_eq!(byte_of('\u{144}'), None);
        assert_eq!(byte_of('é'), Some(0xE9));
    }

    #[test]
    fn token_bytes_are_the_spelled_bytes_or_else_the_text() {
        let mut out = b"x".to_vec();
        assert!(push_token_bytes("Ġhi", &mut out));
        assert_eq!(out, b"x hi");
        assert!(!push_token_bytes("<|im_end|> ", &mut out));
        assert_eq!(out, b"x hi<|im_end|> ");
        assert!(push_token_bytes("", &mut out));
        assert_eq!(out, b"x hi<|im_end|> ");
    }
}
