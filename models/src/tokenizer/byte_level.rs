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

/// The bytes a vocabulary entry decodes to: the spelled bytes when every character is a
/// spelling, else the entry's own UTF-8 (added tokens such as `<|im_end|>` are plain text,
/// which for ASCII punctuation and letters is the same thing).
pub(crate) fn token_bytes(token: &str) -> Vec<u8> {
    token
        .chars()
        .map(byte_of)
        .collect::<Option<Vec<u8>>>()
        .unwrap_or_else(|| token.as_bytes().to_vec())
}

/// Whether every character of `token` is a byte spelling.
pub(crate) fn is_byte_spelled(token: &str) -> bool {
    token.chars().all(|c| byte_of(c).is_some())
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
}
