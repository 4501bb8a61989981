//! Eviction and refault: a mapped decoder keeps decoding while its weights are pushed out of
//! memory, and must produce bitwise the same logits as before.
//!
//! Run A decodes `steps` tokens and keeps every step's logits. Run B decodes the same prompt
//! again; right before step `evict_at` every page of the store is reclaimed
//! (`madvise(MADV_PAGEOUT)` on the process's mappings, then `posix_fadvise(DONTNEED)` on the
//! files) and `mincore` confirms it, so that step refaults all weights from storage. During
//! steps `pressure` a second thread keeps reclaiming every `interval_ms`, so pages vanish
//! while a matmul reads them. Afterwards the store is re-hashed (`verify_dir`).

use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use burn::tensor::Device;
use burn_mapped::host::memstat::rss_self;
use burn_mapped_models::qwen2::argmax;
use serde::{Deserialize, Serialize};

use crate::arms::{Arm, ArmFiles};
use crate::measure::ms;
use crate::qwen;
use crate::stats::Stats;
use crate::sys::{self, PageOut};

/// Parameters of the eviction child.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EvictSpec {
    pub steps: usize,
    pub evict_at: usize,
    pub pressure: Range<usize>,
    pub interval_ms: u64,
}

/// What the eviction child reports.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EvictReport {
    pub spec: EvictSpec,
    pub method: PageOut,
    pub mapped_ranges: usize,
    pub mapped_bytes: u64,
    pub residency_before: f64,
    pub residency_after_evict: f64,
    pub evict_ms: f64,
    pub rss_file_before: u64,
    pub rss_file_after_evict: u64,
    pub rss_file_after_refault: u64,
    /// Step times of run A and run B (step 0 is the prompt).
    pub run_a_step_ms: Vec<f64>,
    pub run_b_step_ms: Vec<f64>,
    /// Step `evict_at` of run B, every weight faulted back in.
    pub refault_step_ms: f64,
    /// Median decode step of run B outside the evicted steps.
    pub steady_step_ms: f64,
    pub background_evictions: usize,
    /// Lowest residency the background thread saw right after reclaiming.
    pub background_min_residency: f64,
    pub logits_identical: bool,
    pub first_mismatch_step: Option<usize>,
    pub tokens_identical: bool,
    pub tokens: Vec<u32>,
    pub verify_ms: f64,
    pub verify_failures: Vec<String>,
    /// Other processes mapping the store when it was evicted (their pages stay resident).
    /// `None` in results written before this was recorded.
    #[serde(default)]
    pub other_mappers: Option<Vec<u32>>,
}

/// Every step's logits, the tokens, and each step's time in ms.
type Decoded = (Vec<Vec<f32>>, Vec<u32>, Vec<f64>);

fn address_bytes(ranges: &[Range<usize>]) -> u64 {
    ranges.iter().map(|r| (r.end - r.start) as u64).sum()
}

/// Runs the experiment in this process (the mapped arm).
pub fn run(
    files: &ArmFiles,
    config_path: &std::path::Path,
    layout: Option<&std::path::Path>,
    prompt: &[u32],
    spec: &EvictSpec,
) -> Result<EvictReport> {
    if spec.evict_at == 0 || spec.evict_at > spec.steps {
        bail!("evict_at must be in 1..={}", spec.steps);
    }
    let device = Device::flex();
    let loaded = qwen::load(Arm::Mapped, files, config_path, layout, &device)?;
    let model = &loaded.model;
    let store_files: Vec<PathBuf> = sys::files_of(&files.store)?;

    let decode = |on_step: &mut dyn FnMut(usize)| -> Result<Decoded> {
        let mut cache = model.new_cache(1, prompt.len() + spec.steps);
        let (mut logits_all, mut tokens, mut times) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..=spec.steps {
            on_step(i);
            let t = Instant::now();
            let logits = if i == 0 {
                qwen::step(model, &mut cache, prompt, &device)?
            } else {
                qwen::step(
                    model,
                    &mut cache,
                    &[*tokens.last().expect("token")],
                    &device,
                )?
            };
            times.push(ms(t));
            tokens.push(argmax(&logits)?);
            logits_all.push(logits);
        }
        Ok((logits_all, tokens, times))
    };

    let (logits_a, tokens_a, times_a) = decode(&mut |_| {})?;
    let ranges = sys::mappings_under(&files.store)?;
    if ranges.is_empty() {
        bail!(
            "no mapping of {} found in /proc/self/maps",
            files.store.display()
        );
    }

    let stop = Arc::new(AtomicBool::new(false));
    let evictions = Arc::new(AtomicUsize::new(0));
    let min_residency = Arc::new(std::sync::Mutex::new(1.0f64));
    let mut worker: Option<std::thread::JoinHandle<Result<()>>> = None;
    let mut method = PageOut::MadvPageout;
    let (mut residency_before, mut residency_after, mut evict_ms) = (0.0, 0.0, 0.0);
    let (mut rss_before, mut rss_after) = (0, 0);
    let mut other_mappers = Vec::new();
    let mut failure: Option<anyhow::Error> = None;
    let (logits_b, tokens_b, times_b) = decode(&mut |i| {
        let result: Result<()> = (|| {
            if i == spec.evict_at {
                residency_before = sys::ranges_residency(&ranges)?;
                rss_before = rss_self()?.file;
                let t = Instant::now();
                method = sys::page_out(&ranges, &store_files)?;
                evict_ms = ms(t);
                residency_after = sys::ranges_residency(&ranges)?;
                rss_after = rss_self()?.file;
                other_mappers = sys::other_mappers(&files.store)?;
            }
            if i == spec.pressure.start && spec.pressure.end > spec.pressure.start {
                let (ranges, store_files) = (ranges.clone(), store_files.clone());
                let (stop, evictions, min_residency) =
                    (stop.clone(), evictions.clone(), min_residency.clone());
                let interval = Duration::from_millis(spec.interval_ms);
                worker = Some(std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        sys::page_out(&ranges, &store_files)?;
                        let r = sys::ranges_residency(&ranges)?;
                        let mut m = min_residency.lock().expect("not poisoned");
                        *m = m.min(r);
                        drop(m);
                        evictions.fetch_add(1, Ordering::Relaxed);
                        std::thread::sleep(interval);
                    }
                    Ok(())
                }));
            }
            if i == spec.pressure.end {
                stop.store(true, Ordering::Relaxed);
            }
            Ok(())
        })();
        if let Err(e) = result {
            failure.get_or_insert(e);
        }
    })?;
    stop.store(true, Ordering::Relaxed);
    if let Some(w) = worker {
        w.join()
            .map_err(|_| anyhow::anyhow!("evictor thread panicked"))??;
    }
    if let Some(e) = failure {
        return Err(e);
    }
    let rss_refault = rss_self()?.file;

    let first_mismatch_step = logits_a.iter().zip(&logits_b).position(|(a, b)| {
        a.iter()
            .map(|v| v.to_bits())
            .ne(b.iter().map(|v| v.to_bits()))
    });
    let steady = Stats::of(
        times_b
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != 0 && i != spec.evict_at && !spec.pressure.contains(&i))
            .map(|(_, &t)| t),
    )
    .map_or(0.0, |s| s.median);

    let t = Instant::now();
    let problems = burn_mapped::verify_dir(&files.store, |_, _| {})?;
    let verify_ms = ms(t);
    let min_res = *min_residency.lock().expect("not poisoned");
    Ok(EvictReport {
        spec: spec.clone(),
        method,
        mapped_ranges: ranges.len(),
        mapped_bytes: address_bytes(&ranges),
        residency_before,
        residency_after_evict: residency_after,
        evict_ms,
        rss_file_before: rss_before,
        rss_file_after_evict: rss_after,
        rss_file_after_refault: rss_refault,
        refault_step_ms: times_b[spec.evict_at],
        steady_step_ms: steady,
        run_a_step_ms: times_a,
        background_evictions: evictions.load(Ordering::Relaxed),
        background_min_residency: min_res,
        run_b_step_ms: times_b,
        logits_identical: first_mismatch_step.is_none() && logits_a.len() == logits_b.len(),
        first_mismatch_step,
        tokens_identical: tokens_a == tokens_b,
        tokens: tokens_b,
        verify_ms,
        verify_failures: problems.iter().map(|e| e.to_string()).collect(),
        other_mappers: Some(other_mappers),
    })
}
