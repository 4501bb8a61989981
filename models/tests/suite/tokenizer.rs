//! The Qwen2 tokenizer on a tiny hand-built vocabulary: no GGUF needed. Expected ids are
//! worked out by hand from the merges below and the Qwen2 split rules.

use burn_mapped_models::tokenizer::{Qwen2Tokenizer, TokenizerError, token_type};
use burn_mapped_tests::synthetic::XorShift;

/// GPT-2's byte alphabet, written out here independently of the crate: printable Latin-1
/// bytes stand for themselves, the rest take U+0100.. in byte order.
fn spelling() -> Vec<char> {
    let self_spelled = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 0x100u32;
    (0..=255u8)
        .map(|b| {
            if self_spelled(b) {
                b as char
            } else {
                next += 1;
                char::from_u32(next - 1).unwrap()
            }
        })
        .collect()
}

const MERGES: [&str; 14] = [
    "h e", "l l", "he ll", "hell o", "Ġ w", "o r", "l d", "Ġw or", "Ġwor ld", "Ã ©", "1 2", "' s",
    "Ġ Ġ", "Ġ x",
];
const SPECIAL: [(&str, i32); 5] = [
    ("<|endoftext|>", token_type::CONTROL),
    ("<|im_start|>", token_type::CONTROL),
    ("<|im_end|>", token_type::CONTROL),
    ("<tool_call>", token_type::USER_DEFINED),
    ("[PAD1]", token_type::UNUSED),
];

/// ids 0..=255: the bytes in order; then one token per merge; then `SPECIAL`.
fn vocab() -> (Vec<String>, Vec<String>, Vec<i32>) {
    let mut tokens: Vec<String> = spelling().iter().map(char::to_string).collect();
    for merge in MERGES {
        tokens.push(merge.replace(' ', ""));
    }
    let mut types = vec![token_type::NORMAL; tokens.len()];
    for (token, kind) in SPECIAL {
        tokens.push(token.to_owned());
        types.push(kind);
    }
    (tokens, MERGES.map(str::to_owned).to_vec(), types)
}

const HELLO: u32 = 259;
const SPACE_WORLD: u32 = 264;
const OR: u32 = 261;
const LD: u32 = 262;
const E_ACUTE: u32 = 265;
const APOSTROPHE_S: u32 = 267;
const TWO_SPACES: u32 = 268;
const SPACE_X: u32 = 269;
const ENDOFTEXT: u32 = 270;
const IM_START: u32 = 271;
const IM_END: u32 = 272;
const TOOL_CALL: u32 = 273;
const PAD1: u32 = 274;

fn tiny() -> Qwen2Tokenizer {
    let (tokens, merges, types) = vocab();
    Qwen2Tokenizer::from_vocab(tokens, merges, types, IM_END, Some(ENDOFTEXT), false).unwrap()
}

fn byte(b: u8) -> u32 {
    b as u32
}

#[test]
fn the_hand_vocab_has_the_ids_the_tests_assume() {
    let t = tiny();
    assert_eq!(t.vocab_size(), 275);
    assert_eq!(t.token_to_id("hello"), Some(HELLO));
    assert_eq!(t.token_to_id("Ġworld"), Some(SPACE_WORLD));
    assert_eq!(t.token_to_id("Ã©"), Some(E_ACUTE));
    assert_eq!(t.token_to_id("12"), Some(266));
    assert_eq!(t.token_to_id("ĠĠ"), Some(TWO_SPACES));
    assert_eq!(t.token_to_id("Ġx"), Some(SPACE_X));
    assert_eq!(t.token_to_id("<|im_end|>"), Some(IM_END));
    assert_eq!(t.token_to_id("[PAD1]"), Some(PAD1));
}

#[test]
fn merges_apply_in_rank_order_within_pre_tokenized_words() {
    let t = tiny();
    assert_eq!(t.encode("hello world").unwrap(), [HELLO, SPACE_WORLD]);
    // Without the leading space "world" is its own word: only "o r" and "l d" apply.
    assert_eq!(t.encode("world").unwrap(), [byte(b'w'), OR, LD]);
    assert_eq!(t.encode("é").unwrap(), [E_ACUTE]);
    assert_eq!(t.encode("").unwrap(), Vec::<u32>::new());
}

#[test]
fn digits_are_split_one_by_one_before_merging() {
    let t = tiny();
    // "1 2" is a merge, but the split regex cuts every digit apart first.
    assert_eq!(t.encode("12").unwrap(), [byte(b'1'), byte(b'2')]);
}

#[test]
fn contractions_and_space_runs_follow_the_qwen2_split() {
    let t = tiny();
    assert_eq!(
        t.encode("it's").unwrap(),
        [byte(b'i'), byte(b't'), APOSTROPHE_S]
    );
    // The upper-case contraction is its own piece too, but only "' s" is a merge.
    assert_eq!(
        t.encode("IT'S").unwrap(),
        [byte(b'I'), byte(b'T'), byte(b'\''), byte(b'S')]
    );
    // "   x": the run of spaces leaves its last space to the word (`\s+(?!\S)`), so the
    // pieces are "  " and " x", each one merge; a plain `\s+` would give "   " and "x".
    assert_eq!(t.encode("   x").unwrap(), [TWO_SPACES, SPACE_X]);
}

#[test]
fn special_tokens_in_text_are_single_ids() {
    let t = tiny();
    assert_eq!(
        t.encode("<|im_start|>hello<|im_end|>\n<|endoftext|>")
            .unwrap(),
        [IM_START, HELLO, IM_END, byte(b'\n'), ENDOFTEXT]
    );
    assert_eq!(t.encode("<tool_call>hello").unwrap(), [TOOL_CALL, HELLO]);
    // A cut-off marker is plain text, and an unused placeholder is not matched whole.
    assert_eq!(t.encode("<|im_end").unwrap().len(), "<|im_end".len());
    assert!(!t.encode("[PAD1]").unwrap().contains(&PAD1));
    assert_eq!(
        t.decode(&[IM_START, HELLO, IM_END, TOOL_CALL, PAD1])
            .unwrap(),
        "<|im_start|>hello<|im_end|><tool_call>[PAD1]"
    );
}

#[test]
fn the_text_a_reader_sees_leaves_out_control_tokens() {
    let t = tiny();
    let ids = [IM_START, HELLO, IM_END, TOOL_CALL, ENDOFTEXT];
    // Control tokens (chat markup) give no text; a user-defined token is text.
    assert_eq!(t.decode_text(&ids).unwrap(), "hello<tool_call>");
    assert!(t.is_control(IM_END) && !t.is_control(TOOL_CALL));
    let mut stream = t.stream_text_decoder();
    let pieces: Vec<String> = ids
        .iter()
        .filter_map(|&id| stream.push(id).unwrap())
        .collect();
    assert_eq!(pieces.concat(), "hello<tool_call>");
    // The plain decoders keep them.
    let mut stream = t.stream_decoder();
    assert_eq!(stream.push(IM_END).unwrap().as_deref(), Some("<|im_end|>"));
}

#[test]
fn eos_ids_are_the_eos_then_im_end_and_endoftext() {
    let t = tiny();
    assert_eq!(t.eos_ids(), [IM_END, ENDOFTEXT]);
    let (tokens, merges, types) = vocab();
    let t = Qwen2Tokenizer::from_vocab(tokens, merges, types, ENDOFTEXT, None, false).unwrap();
    assert_eq!(t.eos_ids(), [ENDOFTEXT, IM_END]);
}

#[test]
fn add_bos_prepends_the_bos_id() {
    let (tokens, merges, types) = vocab();
    let t =
        Qwen2Tokenizer::from_vocab(tokens, merges, types, IM_END, Some(ENDOFTEXT), true).unwrap();
    assert_eq!(t.encode("hello").unwrap(), [ENDOFTEXT, HELLO]);
    assert_eq!(t.encode("").unwrap(), [ENDOFTEXT]);
}

/// Deterministic pseudo-random strings over a mix of scripts, controls and specials.
fn random_texts() -> Vec<String> {
    let pool: Vec<char> = "aZ09 \t\n\r'!?.,_-éÅß漢字😀👍🏽\u{0}\u{7f}\u{200d}\u{ad}\u{a0}\u{10ffff}ﬁ"
        .chars()
        .collect();
    let words = ["<|im_end|>", "<|im_start|>", "hello", " world", "'s", "   "];
    let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
    let mut next = move || rng.next_u64();
    (0..300)
        .map(|_| {
            let len = next() % 40;
            let mut s = String::new();
            for _ in 0..len {
                let r = next();
                if r % 8 == 0 {
                    s.push_str(words[(r / 8) as usize % words.len()]);
                } else {
                    s.push(pool[(r / 8) as usize % pool.len()]);
                }
            }
            s
        })
        .collect()
}

#[test]
fn any_utf8_round_trips_through_encode_and_decode() {
    let t = tiny();
    let mut texts = random_texts();
    // Every byte value, as the characters that encode to it in UTF-8.
    texts.push((0..=0x7Fu8).map(char::from).collect());
    texts.push((0x80..=0x7FFu32).filter_map(char::from_u32).collect());
    for text in texts {
        let ids = t.encode(&text).unwrap();
        assert_eq!(t.decode(&ids).unwrap(), text, "{ids:?}");
    }
}

#[test]
fn the_stream_holds_back_a_character_until_its_last_byte() {
    let t = tiny();
    let mut s = t.stream_decoder();
    assert_eq!(s.push(HELLO).unwrap().as_deref(), Some("hello"));
    // é = C3 A9, sent as two byte tokens.
    assert_eq!(s.push(byte(0xC3)).unwrap(), None);
    assert_eq!(s.pending_bytes(), 1);
    assert_eq!(s.push(byte(0xA9)).unwrap().as_deref(), Some("é"));
    // 😀 = F0 9F 98 80.
    for b in [0xF0, 0x9F, 0x98] {
        assert_eq!(s.push(byte(b)).unwrap(), None);
    }
    assert_eq!(s.pending_bytes(), 3);
    assert_eq!(s.push(byte(0x80)).unwrap().as_deref(), Some("😀"));
    assert_eq!(s.pending_bytes(), 0);
    // A special token after a complete character comes out whole.
    assert_eq!(s.push(IM_END).unwrap().as_deref(), Some("<|im_end|>"));
    assert_eq!(s.finish(), "");
}

#[test]
fn the_stream_replaces_bytes_that_cannot_complete() {
    let t = tiny();
    let mut s = t.stream_decoder();
    // 0xFF never starts a character: replaced at once.
    assert_eq!(s.push(byte(0xFF)).unwrap().as_deref(), Some("\u{FFFD}"));
    // A lead byte followed by ASCII: the lead byte is replaced, the ASCII kept.
    assert_eq!(s.push(byte(0xE4)).unwrap(), None);
    assert_eq!(s.push(byte(b'a')).unwrap().as_deref(), Some("\u{FFFD}a"));
    // An unfinished character at the end of the stream.
    assert_eq!(s.push(byte(0xE4)).unwrap(), None);
    assert_eq!(s.push(byte(0xB8)).unwrap(), None);
    assert_eq!(s.finish(), "\u{FFFD}");
}

#[test]
fn stream_pieces_join_to_the_batch_decode() {
    let t = tiny();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..300 {
        let mut ids = Vec::new();
        for _ in 0..(state % 24) {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ids.push(((state >> 33) % t.vocab_size() as u64) as u32);
        }
        let mut s = t.stream_decoder();
        let mut joined = String::new();
        for &id in &ids {
            if let Some(piece) = s.push(id).unwrap() {
                joined.push_str(&piece);
            }
            assert!(s.pending_bytes() <= 3);
        }
        joined.push_str(&s.finish());
        assert_eq!(joined, t.decode(&ids).unwrap(), "{ids:?}");
    }
}

#[test]
fn rejects_an_id_outside_the_vocabulary_when_decoding() {
    let t = tiny();
    assert!(matches!(
        t.decode(&[HELLO, 275]),
        Err(TokenizerError::IdOutOfRange {
            id: 275,
            vocab_size: 275,
            ..
        })
    ));
    assert!(matches!(
        t.stream_decoder().push(u32::MAX),
        Err(TokenizerError::IdOutOfRange { id: u32::MAX, .. })
    ));
}

fn build(
    edit: impl FnOnce(&mut Vec<String>, &mut Vec<String>, &mut Vec<i32>),
) -> Result<Qwen2Tokenizer, TokenizerError> {
    let (mut tokens, mut merges, mut types) = vocab();
    edit(&mut tokens, &mut merges, &mut types);
    Qwen2Tokenizer::from_vocab(tokens, merges, types, IM_END, Some(ENDOFTEXT), false)
}

#[test]
fn rejects_an_empty_vocabulary() {
    let r = Qwen2Tokenizer::from_vocab(vec![], vec![], vec![], 0, None, false);
    assert!(matches!(r, Err(TokenizerError::EmptyVocabulary)));
}

#[test]
fn rejects_token_types_of_another_length() {
    let r = build(|_, _, types| {
        types.pop();
    });
    assert!(matches!(
        r,
        Err(TokenizerError::TokenTypeCount {
            tokens: 275,
            token_types: 274
        })
    ));
}

#[test]
fn rejects_an_unknown_token_type() {
    let r = build(|_, _, types| types[HELLO as usize] = 7);
    assert!(matches!(
        r,
        Err(TokenizerError::UnknownTokenType {
            id: HELLO,
            token_type: 7,
            ..
        })
    ));
}

#[test]
fn rejects_a_duplicate_token() {
    let r = build(|tokens, _, _| tokens[PAD1 as usize] = "hello".into());
    assert!(matches!(
        r,
        Err(TokenizerError::DuplicateToken {
            first: HELLO,
            second: PAD1,
            ..
        })
    ));
}

#[test]
fn rejects_a_normal_token_outside_the_byte_alphabet() {
    // A literal space is spelled "Ġ" in a byte-level vocabulary; only rows that BPE may
    // produce (normal ones) must be spelled that way.
    assert!(build(|tokens, _, _| tokens[PAD1 as usize] = "a b".into()).is_ok());
    let r = build(|tokens, _, types| {
        tokens[PAD1 as usize] = "a b".into();
        types[PAD1 as usize] = token_type::NORMAL;
    });
    assert!(matches!(
        r,
        Err(TokenizerError::NotByteLevel { id: PAD1, .. })
    ));
}

#[test]
fn rejects_a_vocabulary_missing_a_byte() {
    // Byte 0x00 is spelled U+0100.
    let r = build(|tokens, _, _| tokens[0] = "Ā_gone".into());
    assert!(matches!(
        r,
        Err(TokenizerError::MissingByteToken {
            byte: 0,
            spelling: 'Ā'
        })
    ));
}

#[test]
fn rejects_a_malformed_merge() {
    for bad in ["hello", "h  e", " h", "h ", "a b c"] {
        let r = build(|_, merges, _| merges[3] = bad.into());
        assert!(
            matches!(&r, Err(TokenizerError::MalformedMerge { index: 3, merge }) if merge == bad),
            "{bad:?}: {r:?}"
        );
    }
}

#[test]
fn rejects_a_merge_of_unknown_tokens() {
    let r = build(|_, merges, _| merges.push("x y".into()));
    assert!(matches!(
        &r,
        Err(TokenizerError::MergeOutOfVocabulary { index: 14, missing, .. }) if missing == "xy"
    ));
    let r = build(|_, merges, _| merges.push("hello q7".into()));
    assert!(matches!(
        &r,
        Err(TokenizerError::MergeOutOfVocabulary { missing, .. }) if missing == "q7"
    ));
}

#[test]
fn rejects_special_ids_outside_the_vocabulary() {
    let (tokens, merges, types) = vocab();
    let r = Qwen2Tokenizer::from_vocab(tokens, merges, types, 275, None, false);
    assert!(matches!(
        r,
        Err(TokenizerError::IdOutOfRange {
            what: "EOS",
            id: 275,
            vocab_size: 275
        })
    ));
    let (tokens, merges, types) = vocab();
    let r = Qwen2Tokenizer::from_vocab(tokens, merges, types, IM_END, Some(9999), false);
    assert!(matches!(
        r,
        Err(TokenizerError::IdOutOfRange {
            what: "BOS",
            id: 9999,
            ..
        })
    ));
}

#[test]
fn rejects_add_bos_without_a_bos_id() {
    let (tokens, merges, types) = vocab();
    let r = Qwen2Tokenizer::from_vocab(tokens, merges, types, IM_END, None, true);
    assert!(matches!(r, Err(TokenizerError::AddBosWithoutBos)));
}
