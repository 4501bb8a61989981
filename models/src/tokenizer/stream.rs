//! Incremental decoding for generation, where ids arrive one at a time.
//!
//! A byte-level token may end in the middle of a UTF-8 character (an emoji is often four
//! one-byte tokens), so the decoder keeps the bytes of an unfinished character until the ids
//! that complete it arrive. Bytes that can never become valid UTF-8 are replaced by U+FFFD at
//! once, with the same rule as [`String::from_utf8_lossy`]; so the pieces joined are exactly
//! what [`Qwen2Tokenizer::decode`] gives for all the ids together.

use super::{Qwen2Tokenizer, TokenizerError};

/// Streaming decoder from [`Qwen2Tokenizer::stream_decoder`].
#[derive(Debug)]
pub struct StreamDecoder<'t> {
    tokenizer: &'t Qwen2Tokenizer,
    /// Bytes of a character that is not complete yet: at most 3.
    pending: Vec<u8>,
    /// Whether control tokens give no text.
    skip_control: bool,
}

impl<'t> StreamDecoder<'t> {
    pub(super) fn new(tokenizer: &'t Qwen2Tokenizer, skip_control: bool) -> Self {
        Self {
            tokenizer,
            pending: Vec::with_capacity(8),
            skip_control,
        }
    }

    /// Adds one id; returns the text it completes, or `None` while a character is still
    /// incomplete (or the token is empty, or a control token this decoder skips).
    pub fn push(&mut self, id: u32) -> Result<Option<String>, TokenizerError> {
        if self.skip_control && self.tokenizer.is_control(id) {
            return Ok(None);
        }
        self.pending
            .extend_from_slice(self.tokenizer.token_bytes(id)?);
        let text = drain_complete(&mut self.pending);
        Ok((!text.is_empty()).then_some(text))
    }

    /// Number of bytes held back, waiting for the rest of their character.
    pub fn pending_bytes(&self) -> usize {
        self.pending.len()
    }

    /// Ends the stream: what is still held back is an incomplete character, returned as
    /// U+FFFD (empty when nothing is held back).
    pub fn finish(self) -> String {
        String::from_utf8_lossy(&self.pending).into_owned()
    }
}

/// Removes and returns the longest prefix of `bytes` that is decided: valid characters, and
/// U+FFFD for each invalid sequence. Leaves only an incomplete character at the end.
fn drain_complete(bytes: &mut Vec<u8>) -> String {
    let mut out = String::new();
    let mut start = 0;
    while start < bytes.len() {
        match std::str::from_utf8(&bytes[start..]) {
            Ok(valid) => {
                out.push_str(valid);
                start = bytes.len();
            }
            Err(e) => {
                let valid_end = start + e.valid_up_to();
                // `valid_up_to` bytes are valid UTF-8, so this never substitutes.
                out.push_str(&String::from_utf8_lossy(&bytes[start..valid_end]));
                match e.error_len() {
                    Some(invalid) => {
                        out.push(char::REPLACEMENT_CHARACTER);
                        start = valid_end + invalid;
                    }
                    // The input ended inside a character that may still complete.
                    None => {
                        start = valid_end;
                        break;
                    }
                }
            }
        }
    }
    bytes.drain(..start);
    out
}

#[cfg(test)]
mod tests {
    // Internals: drain_complete is private; the public behavior is tested in tests/suite/tokenizer.rs.
    use super::drain_complete;

    #[test]
    fn drains_like_from_utf8_lossy_when_fed_byte_by_byte() {
        let inputs: [&[u8]; 6] = [
            "héllo 😀 世界".as_bytes(),
            b"\xF0\x9F\x98",
            b"a\xE4\xB8b",
            b"\xFF\xFE ok \xC3",
            b"\xED\xA0\x80",
            b"\xF4\x90\x80\x80 \xE2\x82",
        ];
        for input in inputs {
            let mut pending = Vec::new();
            let mut joined = String::new();
            for &b in input {
                pending.push(b);
                joined.push_str(&drain_complete(&mut pending));
                assert!(pending.len() <= 3, "{input:?}");
            }
            joined.push_str(&String::from_utf8_lossy(&pending));
            assert_eq!(joined, String::from_utf8_lossy(input), "{input:?}");
        }
    }
}
