//! The child side: the harness re-executes itself with one [`ChildSpec`] (as JSON) per
//! measurement, so every arm starts in a fresh process.

use std::io::{BufRead, Write};
use std::path::PathBuf;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::arms::{Arm, ArmFiles};
use crate::evict::{self, EvictSpec};
use crate::{qwen, synth};

/// One child's job.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ChildSpec {
    /// Load Qwen through `arm`, answer the prompt, decode `decode_tokens` more tokens.
    Qwen {
        arm: Arm,
        files: ArmFiles,
        config: PathBuf,
        /// The q8 projections' paths (`QwenSetup::layout_path`); `None` for a float store.
        #[serde(default)]
        layout: Option<PathBuf>,
        prompt: Vec<u32>,
        decode_tokens: usize,
        /// Print the sample, then hold the model until standard input closes (the
        /// sharing experiment measures every process while all are alive).
        hold: bool,
    },
    /// Load the synthetic stack through `arm` and run one token through it.
    Synthetic {
        arm: Arm,
        files: ArmFiles,
        layers: usize,
        dim: usize,
    },
    /// The eviction and refault experiment on the mapped arm.
    Evict {
        files: ArmFiles,
        config: PathBuf,
        #[serde(default)]
        layout: Option<PathBuf>,
        prompt: Vec<u32>,
        spec: EvictSpec,
    },
}

/// Runs `spec` and prints its result as one JSON line on standard output.
pub fn run(spec: &ChildSpec) -> Result<()> {
    let line = match spec {
        ChildSpec::Qwen {
            arm,
            files,
            config,
            layout,
            prompt,
            decode_tokens,
            hold,
        } => {
            let layout = layout.as_deref();
            let sample = qwen::run(
                *arm,
                files,
                config,
                layout,
                prompt,
                *decode_tokens,
                |sample| {
                    if *hold {
                        let mut out = std::io::stdout().lock();
                        writeln!(out, "{}", serde_json::to_string(sample)?)?;
                        out.flush()?;
                        drop(out);
                        // Keep the model (and its memory) until the parent has measured everyone.
                        for line in std::io::stdin().lock().lines() {
                            line?;
                        }
                    }
                    Ok(())
                },
            )?;
            if *hold {
                return Ok(());
            }
            serde_json::to_string(&sample)?
        }
        ChildSpec::Synthetic {
            arm,
            files,
            layers,
            dim,
        } => serde_json::to_string(&synth::run(*arm, files, *layers, *dim)?)?,
        ChildSpec::Evict {
            files,
            config,
            layout,
            prompt,
            spec,
        } => serde_json::to_string(&evict::run(files, config, layout.as_deref(), prompt, spec)?)?,
    };
    println!("{line}");
    Ok(())
}
