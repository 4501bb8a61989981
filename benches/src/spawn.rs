//! Running children: the harness re-executes itself with one [`ChildSpec`] per measurement,
//! either to completion (one JSON line back) or as `n` holding processes that are measured
//! together while all are alive.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use burn_mapped::host::memstat;

use crate::arms::Arm;
use crate::child::ChildSpec;
use crate::measure::ms;
use crate::qwen::QwenSample;
use crate::report::{ShareCell, ShareProcess};

fn exe() -> Result<PathBuf> {
    Ok(std::env::current_exe()?)
}

/// Runs one child to completion; returns its last stdout line and its wall time in ms.
pub fn run_child(spec: &ChildSpec) -> Result<(String, f64)> {
    let t = Instant::now();
    let out = Command::new(exe()?)
        .arg("child")
        .arg(serde_json::to_string(spec)?)
        .stdin(Stdio::null())
        .output()
        .context("spawning a child")?;
    let wall = ms(t);
    if !out.status.success() {
        bail!(
            "child {} failed ({}): {}",
            serde_json::to_string(spec)?
                .chars()
                .take(120)
                .collect::<String>(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().context("child printed nothing")?;
    Ok((line.to_string(), wall))
}

/// `n` concurrent holding children of one arm, measured while all are alive.
pub fn share_cell(spec: &ChildSpec, arm: Arm, n: usize) -> Result<ShareCell> {
    let t = Instant::now();
    let json = serde_json::to_string(spec)?;
    let mut children = Vec::new();
    for _ in 0..n {
        children.push(
            Command::new(exe()?)
                .arg("child")
                .arg(&json)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .context("spawning a sharing child")?,
        );
    }
    let mut samples = Vec::new();
    let mut result: Result<()> = Ok(());
    for child in &mut children {
        let stdout = child.stdout.take().expect("piped");
        let mut line = String::new();
        if let Err(e) = BufReader::new(stdout).read_line(&mut line) {
            result = Err(e.into());
            break;
        }
        match serde_json::from_str::<QwenSample>(line.trim()) {
            Ok(s) => samples.push(s),
            Err(e) => {
                result = Err(anyhow::anyhow!(
                    "sharing child printed `{}`: {e}",
                    line.trim()
                ));
                break;
            }
        }
    }
    let mut per_process = Vec::new();
    if result.is_ok() {
        for (child, s) in children.iter().zip(&samples) {
            let pid = child.id().to_string();
            match (memstat::pss_of(&pid), memstat::rss_of(&pid)) {
                (Ok((pss, anonymous)), Ok(rss)) => per_process.push(ShareProcess {
                    pss,
                    anonymous,
                    rss_anon: rss.anon,
                    rss_file: rss.file,
                    model_ready_ms: s.model_ready_ms,
                    decode_tok_s: s.decode_tok_s,
                }),
                (Err(e), _) | (_, Err(e)) => {
                    result = Err(e.into());
                    break;
                }
            }
        }
    }
    // Release everyone (closing stdin ends their wait), then reap.
    for child in &mut children {
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.flush();
        }
    }
    for mut child in children {
        let status = child.wait()?;
        if result.is_ok() && !status.success() {
            result = Err(anyhow::anyhow!(
                "a sharing child of {} exited with {status}",
                arm.name()
            ));
        }
    }
    result?;
    Ok(ShareCell {
        arm,
        processes: n,
        skipped: None,
        total_pss: per_process.iter().map(|p| p.pss).sum(),
        total_anonymous: per_process.iter().map(|p| p.anonymous).sum(),
        total_rss_anon: per_process.iter().map(|p| p.rss_anon).sum(),
        total_rss_file: per_process.iter().map(|p| p.rss_file).sum(),
        per_process,
        tokens: samples.into_iter().map(|s| s.tokens).collect(),
        wall_ms: ms(t),
    })
}
