//! The identity checks: every arm, round and phase must produce bitwise the same tokens and
//! logits as the first warm sample of its store, or the timings compare different work.

use crate::evict::EvictReport;
use crate::qwen::QwenSample;
use crate::report::{QwenIdentity, ShareCell};
use crate::synth::SynthSample;

/// Tokens and logits of every sample of one store against its first warm sample.
pub fn qwen_identity(
    tag: &str,
    warm: &[QwenSample],
    cold: &[QwenSample],
    share: &[ShareCell],
    evict: Option<&EvictReport>,
) -> QwenIdentity {
    let mut id = QwenIdentity::default();
    if let Some(first) = warm.first() {
        let mut tokens_ok = true;
        let mut logits_ok = true;
        // Which sample a mismatch is of.
        let sample = |phase: &str, s: &QwenSample| {
            format!("qwen {tag} {phase} round {} {}", s.round, s.arm.name())
        };
        for s in warm {
            if s.tokens != first.tokens {
                tokens_ok = false;
                id.mismatches.push(format!(
                    "{}: tokens {:?} differ from {:?}",
                    sample("warm", s),
                    s.tokens,
                    first.tokens
                ));
            }
            if s.first_logits_xxh3 != first.first_logits_xxh3
                || s.all_logits_xxh3 != first.all_logits_xxh3
            {
                logits_ok = false;
                id.mismatches.push(format!(
                    "{}: logits hash {}/{} differs from {}/{}",
                    sample("warm", s),
                    s.first_logits_xxh3,
                    s.all_logits_xxh3,
                    first.first_logits_xxh3,
                    first.all_logits_xxh3
                ));
            }
        }
        for s in cold {
            if s.tokens.first() != first.tokens.first()
                || s.first_logits_xxh3 != first.first_logits_xxh3
            {
                tokens_ok = false;
                id.mismatches.push(format!(
                    "{}: first token or logits differ",
                    sample("cold", s)
                ));
            }
        }
        id.tokens_identical = Some(tokens_ok);
        id.logits_identical = Some(logits_ok);
        let mut share_ok = None;
        for c in share.iter().filter(|c| c.skipped.is_none()) {
            let ok = c
                .tokens
                .iter()
                .all(|t| first.tokens.starts_with(t) || t.starts_with(&first.tokens));
            if !ok {
                id.mismatches.push(format!(
                    "qwen {tag} sharing {} x{}: tokens differ",
                    c.arm.name(),
                    c.processes
                ));
            }
            share_ok = Some(share_ok.unwrap_or(true) && ok);
        }
        id.share_tokens_identical = share_ok;
        if let Some(e) = evict {
            let ok = e.logits_identical && e.tokens_identical && e.verify_failures.is_empty();
            let prefix_ok =
                first.tokens.starts_with(&e.tokens) || e.tokens.starts_with(&first.tokens);
            if !ok || !prefix_ok {
                id.mismatches.push(format!(
                    "qwen {tag} eviction: logits identical {}, tokens identical {}, verify failures {}, matches the arms' tokens {}",
                    e.logits_identical,
                    e.tokens_identical,
                    e.verify_failures.len(),
                    prefix_ok
                ));
            }
            id.evict_logits_identical = Some(ok && prefix_ok);
        }
    }
    id
}

/// Whether every synthetic sample's output hash equals the first one's.
pub fn synthetic_outputs_identical(samples: &[SynthSample]) -> bool {
    let first = samples.first().map(|s| &s.output_xxh3);
    samples.iter().all(|s| Some(&s.output_xxh3) == first)
}
