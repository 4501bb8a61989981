//! The Qwen2 tokenizer built from the real GGUF's vocabulary against ids from Hugging Face
//! transformers' GGUF tokenizer conversion, and the hand-written chat prompt against the
//! GGUF's Jinja template as transformers renders it. Fixtures: `fixtures/tokenizer/`, written
//! by `make_reference.py`.
//!
//! The vocabulary is read from the GGUF at run time (not committed): `$BURN_MAPPED_GGUF`, else
//! the default cache path. Without it the GGUF tests print a note and pass, unless
//! `BURN_MAPPED_REQUIRE_REAL=1`.

use crate::common;

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Instant;

use burn_mapped_models::tokenizer::{DEFAULT_SYSTEM_PROMPT, Qwen2Tokenizer, chat_prompt};
use burn_mapped_tests::real_gguf;
use common::gguf_meta::{TokenizerMeta, tokenizer_meta};
use serde_json::Value;

fn fixture(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tokenizer")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|i| u32::try_from(i.as_u64().unwrap()).unwrap())
        .collect()
}

/// The GGUF's tokenizer metadata and the tokenizer built from it, read once for all tests.
fn real_tokenizer() -> Option<&'static (TokenizerMeta, Qwen2Tokenizer)> {
    static REAL: OnceLock<Option<(TokenizerMeta, Qwen2Tokenizer)>> = OnceLock::new();
    REAL.get_or_init(|| {
        let meta = tokenizer_meta(&real_gguf()?);
        let tokenizer = build(&meta);
        Some((meta, tokenizer))
    })
    .as_ref()
}

fn build(meta: &TokenizerMeta) -> Qwen2Tokenizer {
    Qwen2Tokenizer::from_vocab(
        meta.tokens.clone(),
        meta.merges.clone(),
        meta.token_types.clone(),
        meta.eos,
        meta.bos,
        meta.add_bos,
    )
    .unwrap()
}

#[test]
fn chat_prompt_matches_jinja() {
    let chat = fixture("chat_template.json");
    let cases = chat["cases"].as_array().unwrap();
    assert!(cases.len() >= 3);
    let mut saw_default = false;
    for case in cases {
        let system = case["system"].as_str();
        saw_default |= system.is_none();
        let user = case["user"].as_str().unwrap();
        assert_eq!(
            chat_prompt(system, user),
            case["prompt"].as_str().unwrap(),
            "system {system:?}, user {user:?}"
        );
    }
    assert!(saw_default);
    // The default is the template's own text.
    assert!(
        chat["template"]
            .as_str()
            .unwrap()
            .contains(DEFAULT_SYSTEM_PROMPT)
    );
}

#[test]
fn the_gguf_carries_the_template_and_vocabulary_the_fixtures_were_made_from() {
    let Some((meta, tokenizer)) = real_tokenizer() else {
        return;
    };
    let reference = fixture("reference.json");
    assert_eq!(meta.model, "gpt2");
    assert_eq!(meta.pre, "qwen2");
    assert_eq!(
        meta.chat_template.as_deref(),
        fixture("chat_template.json")["template"].as_str(),
        "the GGUF's chat template differs from the one chat_prompt implements"
    );
    assert_eq!(tokenizer.vocab_size() as u64, reference["vocab_size"]);
    assert_eq!(meta.merges.len() as u64, reference["merges"]);
    assert_eq!(tokenizer.eos() as u64, reference["eos_token_id"]);
    assert_eq!(
        tokenizer.bos().map(u64::from),
        reference["bos_token_id"].as_u64()
    );
}

#[test]
fn encode_and_decode_match_transformers_on_the_real_vocabulary() {
    let Some((_, tokenizer)) = real_tokenizer() else {
        return;
    };
    let reference = fixture("reference.json");
    let cases = reference["cases"].as_array().unwrap();
    assert!(cases.len() >= 30);
    let mut failures = Vec::new();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let expected = ids(&case["ids"]);
        let ours = tokenizer.encode(text).unwrap();
        if ours != expected {
            failures.push(format!(
                "{text:?}\n  ours   {ours:?}\n  theirs {expected:?}"
            ));
        }
        assert_eq!(
            tokenizer.decode(&expected).unwrap(),
            case["decoded"].as_str().unwrap(),
            "decode of {expected:?}"
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    for case in reference["decode_cases"].as_array().unwrap() {
        let expected = ids(&case["ids"]);
        assert_eq!(
            tokenizer.decode(&expected).unwrap(),
            case["decoded"].as_str().unwrap(),
            "decode of {expected:?}"
        );
    }
}

#[test]
fn chat_prompts_encode_like_transformers() {
    let Some((_, tokenizer)) = real_tokenizer() else {
        return;
    };
    let reference = fixture("reference.json");
    let chat = fixture("chat_template.json");
    for case in chat["cases"].as_array().unwrap() {
        let prompt = chat_prompt(case["system"].as_str(), case["user"].as_str().unwrap());
        let expected = reference["cases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["text"].as_str() == Some(prompt.as_str()))
            .expect("every chat prompt has reference ids");
        assert_eq!(tokenizer.encode(&prompt).unwrap(), ids(&expected["ids"]));
    }
    assert_eq!(tokenizer.eos_ids(), ids(&reference["eos_ids_chat"]));
}

#[test]
fn streaming_the_reference_ids_gives_the_reference_text() {
    let Some((_, tokenizer)) = real_tokenizer() else {
        return;
    };
    let reference = fixture("reference.json");
    let mut held_back = 0;
    for case in reference["cases"].as_array().unwrap() {
        let mut stream = tokenizer.stream_decoder();
        let mut joined = String::new();
        for id in ids(&case["ids"]) {
            match stream.push(id).unwrap() {
                // Valid UTF-8 input: no piece ever carries a replacement character.
                Some(piece) => {
                    assert!(!piece.contains('\u{FFFD}'), "{piece:?}");
                    joined.push_str(&piece);
                }
                None => held_back += 1,
            }
        }
        assert_eq!(stream.finish(), "");
        assert_eq!(joined, case["decoded"].as_str().unwrap());
    }
    // The emoji and CJK cases cut characters across ids, so something was held back.
    assert!(held_back > 0);
}

/// Throughput on a few KB of the reference texts; printed for information, not asserted.
#[test]
fn throughput_on_the_real_vocabulary() {
    let Some((meta, _)) = real_tokenizer() else {
        return;
    };
    let start = Instant::now();
    let tokenizer = build(meta);
    let build_time = start.elapsed();
    let reference = fixture("reference.json");
    let mut text = String::new();
    for case in reference["cases"].as_array().unwrap() {
        text.push_str(case["text"].as_str().unwrap());
        text.push('\n');
    }
    let ids = tokenizer.encode(&text).unwrap();
    let rounds = 20;
    let start = Instant::now();
    for _ in 0..rounds {
        assert_eq!(tokenizer.encode(&text).unwrap().len(), ids.len());
    }
    let encode = start.elapsed().as_secs_f64() / rounds as f64;
    let start = Instant::now();
    for _ in 0..rounds {
        assert_eq!(tokenizer.decode(&ids).unwrap(), text);
    }
    let decode = start.elapsed().as_secs_f64() / rounds as f64;
    let start = Instant::now();
    for _ in 0..rounds {
        let mut stream = tokenizer.stream_decoder();
        for &id in &ids {
            stream.push(id).unwrap();
        }
    }
    let stream = start.elapsed().as_secs_f64() / rounds as f64;
    let kb = text.len() as f64 / 1024.0;
    println!(
        "tokenizer: build {:.0} ms; {:.1} KB = {} tokens; encode {:.2} ms ({:.1} MB/s), \
         decode {:.3} ms ({:.0} MB/s), stream {:.3} ms",
        build_time.as_secs_f64() * 1e3,
        kb,
        ids.len(),
        encode * 1e3,
        kb / 1024.0 / encode,
        decode * 1e3,
        kb / 1024.0 / decode,
        stream * 1e3,
    );
}
