//! The Qwen2 tokenizer (its own BPE model over ids) against the `tokenizers` crate's `BPE` in
//! the same pipeline, both built from the real GGUF's vocabulary, on this crate's sources and
//! on pseudo-random text: the ids must be the same everywhere, not only on the transformers
//! reference cases.
//!
//! The vocabulary is read from the GGUF at run time, as in `tokenizer_matches_reference.rs`.

use crate::common;

use std::path::Path;

use burn_mapped_models::tokenizer::{QWEN2_SPLIT_REGEX, Qwen2Tokenizer, token_type};
use burn_mapped_tests::real_gguf;
use burn_mapped_tests::synthetic::XorShift;
use common::gguf_meta::tokenizer_meta;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer};

/// The pipeline built the straightforward way: `tokenizers`' `BPE` from string maps.
fn with_tokenizers_bpe(tokens: &[String], merges: &[String], types: &[i32]) -> Tokenizer {
    let vocab: Vocab = (0u32..)
        .zip(tokens)
        .map(|(id, t)| (t.clone(), id))
        .collect();
    let merges = merges
        .iter()
        .map(|m| {
            let (l, r) = m.split_once(' ').unwrap();
            (l.to_owned(), r.to_owned())
        })
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .unwrap();
    let split = Split::new(
        SplitPattern::Regex(QWEN2_SPLIT_REGEX.to_owned()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .unwrap();
    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer.with_pre_tokenizer(Some(Sequence::new(vec![
        PreTokenizerWrapper::Split(split),
        PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, false)),
    ])));
    let added = |kind, special| -> Vec<_> {
        tokens
            .iter()
            .zip(types)
            .filter(|&(_, &t)| t == kind)
            .map(|(token, _)| AddedToken::from(token.clone(), special).normalized(false))
            .collect()
    };
    tokenizer.add_special_tokens(&added(token_type::CONTROL, true));
    tokenizer.add_tokens(&added(token_type::USER_DEFINED, false));
    tokenizer
}

/// This crate's `.rs` files, then pseudo-random strings: arbitrary bytes (made valid UTF-8)
/// and mixes of letters, digits, spaces, newlines, emoji and special-token text.
fn texts() -> Vec<String> {
    fn sources(dir: &Path, out: &mut Vec<String>) {
        for path in burn_mapped_tests::synthetic::sorted_entries(dir) {
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    let mut texts = Vec::new();
    sources(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut texts,
    );
    assert!(texts.len() > 5);
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    let mut next = move || rng.next_u64();
    let pieces = [
        "a",
        "b",
        "ab",
        " ",
        "  ",
        "\n",
        "\r\n",
        "\t",
        "0",
        "12",
        "é",
        "😀",
        "世界",
        "'s",
        "<|im_end|>",
        "<|im_start|>",
        "<tool_call>",
        "Ġ",
        "def",
        "fn",
    ];
    for _ in 0..1000 {
        let len = (next() % 200) as usize;
        let bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        texts.push(String::from_utf8_lossy(&bytes).into_owned());
        texts.push(
            (0..len / 2)
                .map(|_| pieces[(next() % pieces.len() as u64) as usize])
                .collect(),
        );
    }
    texts
}

#[test]
fn encodes_like_the_tokenizers_bpe_on_the_real_vocabulary() {
    let Some(path) = real_gguf() else {
        return;
    };
    let meta = tokenizer_meta(&path);
    let reference = with_tokenizers_bpe(&meta.tokens, &meta.merges, &meta.token_types);
    let ours = Qwen2Tokenizer::from_vocab(
        meta.tokens.clone(),
        meta.merges.clone(),
        meta.token_types.clone(),
        meta.eos,
        meta.bos,
        false,
    )
    .unwrap();
    let mut tokens = 0;
    for text in texts() {
        let expected = reference.encode_fast(text.as_str(), false).unwrap();
        let ids = ours.encode(&text).unwrap();
        assert_eq!(ids, expected.get_ids(), "{text:?}");
        tokens += ids.len();
    }
    assert!(tokens > 100_000, "{tokens}");
}
