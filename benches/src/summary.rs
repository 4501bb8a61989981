//! Per-arm summaries of a phase's samples (medians with their range, and per-round ratios
//! against `load_file`): what the tables, the figures and the targets read.

use serde::{Deserialize, Serialize};

use crate::arms::Arm;
use crate::qwen::QwenSample;
use crate::stats::{Stats, paired};
use crate::synth::SynthSample;

/// Per-arm summary of the Qwen samples.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QwenArmSummary {
    pub arm: Arm,
    pub model_ready_ms: Option<Stats>,
    pub ttft_ms: Option<Stats>,
    /// Per round: load_file's time over this arm's (how many times faster).
    pub ready_speedup_vs_load_file: Option<Stats>,
    pub ttft_speedup_vs_load_file: Option<Stats>,
    pub decode_tok_s: Option<Stats>,
    pub anon_after_load: Option<Stats>,
    pub file_after_load: Option<Stats>,
    pub peak_after_load: Option<Stats>,
    pub anon_after_decode: Option<Stats>,
    pub file_after_decode: Option<Stats>,
    pub peak_after_decode: Option<Stats>,
}

fn by_round<'a, T>(
    samples: &'a [T],
    arm: Arm,
    get: impl Fn(&T) -> (Arm, usize, f64) + 'a,
) -> Vec<(usize, f64)> {
    samples
        .iter()
        .map(get)
        .filter(|&(a, _, _)| a == arm)
        .map(|(_, r, v)| (r, v))
        .collect()
}

/// Summaries per arm, in [`Arm::ALL`] order, of arms that have samples.
pub fn summarize_qwen(samples: &[QwenSample]) -> Vec<QwenArmSummary> {
    let col = |arm: Arm, f: &dyn Fn(&QwenSample) -> f64| {
        Stats::of(samples.iter().filter(|s| s.arm == arm).map(f))
    };
    let rounds = |arm: Arm, f: fn(&QwenSample) -> f64| {
        by_round(samples, arm, move |s| (s.arm, s.round, f(s)))
    };
    Arm::ALL
        .into_iter()
        .filter(|&a| samples.iter().any(|s| s.arm == a))
        .map(|arm| {
            let decoded = samples.iter().any(|s| s.arm == arm && s.decode_tokens > 0);
            QwenArmSummary {
                arm,
                model_ready_ms: col(arm, &|s| s.model_ready_ms),
                ttft_ms: col(arm, &|s| s.ttft_ms),
                ready_speedup_vs_load_file: paired(
                    &rounds(Arm::LoadFile, |s| s.model_ready_ms),
                    &rounds(arm, |s| s.model_ready_ms),
                ),
                ttft_speedup_vs_load_file: paired(
                    &rounds(Arm::LoadFile, |s| s.ttft_ms),
                    &rounds(arm, |s| s.ttft_ms),
                ),
                decode_tok_s: if decoded {
                    col(arm, &|s| s.decode_tok_s)
                } else {
                    None
                },
                anon_after_load: col(arm, &|s| s.mem_after_load.anon as f64),
                file_after_load: col(arm, &|s| s.mem_after_load.file as f64),
                peak_after_load: col(arm, &|s| s.mem_after_load.peak as f64),
                anon_after_decode: col(arm, &|s| s.mem_after_decode.anon as f64),
                file_after_decode: col(arm, &|s| s.mem_after_decode.file as f64),
                peak_after_decode: col(arm, &|s| s.mem_after_decode.peak as f64),
            }
        })
        .collect()
}

/// Per-arm summary of the synthetic samples.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SynthArmSummary {
    pub arm: Arm,
    pub load_ms: Option<Stats>,
    pub ready_ms: Option<Stats>,
    pub ready_speedup_vs_load_file: Option<Stats>,
    pub anon_after_load: Option<Stats>,
    pub file_after_load: Option<Stats>,
    pub peak_after_forward: Option<Stats>,
    pub anon_after_forward: Option<Stats>,
}

pub fn summarize_synth(samples: &[SynthSample]) -> Vec<SynthArmSummary> {
    let col = |arm: Arm, f: &dyn Fn(&SynthSample) -> f64| {
        Stats::of(samples.iter().filter(|s| s.arm == arm).map(f))
    };
    let rounds = |arm: Arm| by_round(samples, arm, |s| (s.arm, s.round, s.ready_ms));
    Arm::ALL
        .into_iter()
        .filter(|&a| samples.iter().any(|s| s.arm == a))
        .map(|arm| SynthArmSummary {
            arm,
            load_ms: col(arm, &|s| s.load_ms),
            ready_ms: col(arm, &|s| s.ready_ms),
            ready_speedup_vs_load_file: paired(&rounds(Arm::LoadFile), &rounds(arm)),
            anon_after_load: col(arm, &|s| s.mem_after_load.anon as f64),
            file_after_load: col(arm, &|s| s.mem_after_load.file as f64),
            peak_after_forward: col(arm, &|s| s.mem_after_forward.peak as f64),
            anon_after_forward: col(arm, &|s| s.mem_after_forward.anon as f64),
        })
        .collect()
}
