//! How an arm is timed: warm-up, timed passes, the optional device clock, and the figures
//! each arm reports.

use std::time::Instant;

use anyhow::{Context, Result};
use burn::tensor::Device;
use serde::Serialize;

use super::args::Args;
use crate::stats::Stats;

/// One arm's figures, as the report lists them.
#[derive(Serialize)]
pub struct ArmResult {
    pub arm: String,
    pub t: usize,
    pub matrices: usize,
    pub bytes_per_pass: u64,
    pub passes: usize,
    pub median_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
    pub gbps_median: f64,
    pub gbps_best: f64,
    pub gbps_worst: f64,
    /// Median host time spent enqueueing a pass (before the sync).
    pub enqueue_ms: f64,
    /// With `--flush-first`: median host time of the submission between enqueue and sync.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flush_ms: Option<f64>,
    /// Passes enqueued per sync (1 under the protocol; more in diagnostic arms, whose times
    /// are per pass).
    pub passes_per_sync: usize,
    /// With `--device-time`: median device time per pass (the device's clock over a profiling
    /// window around the passes of one sync), and how Burn measured it (`Device` when the
    /// adapter has timestamp queries, else `System`: wall time between syncs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_min_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_max_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_timing: Option<String>,
    /// When the arm started and ended (Unix seconds), to line it up with clock samples.
    pub span_unix_s: [f64; 2],
    /// The GPU kernels' launch shape, for the q8, read and graph arms on a CubeCL device.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tuning: Option<String>,
}

/// How one arm is timed: `per_sync` passes of `enqueue`, then one sync, timed as a unit
/// and divided by `per_sync` (1 under the protocol). With `profile`, the passes are timed a
/// second time on the device's clock.
#[derive(Clone)]
pub struct Timing<'a> {
    pub per_sync: usize,
    pub sync: &'a dyn Fn() -> Result<()>,
    /// Submits what is enqueued without waiting (`--flush-first`), timed apart.
    pub flush: Option<&'a dyn Fn() -> Result<()>>,
    pub tuning: Option<String>,
    pub profile: Option<&'a Device>,
}

impl Timing<'_> {
    /// The same timing, labelled with the launch shape the arm runs.
    pub fn labelled(&self, tuning: Option<String>) -> Self {
        Timing {
            tuning,
            ..self.clone()
        }
    }
}

/// Polls `f` to completion on this thread (Burn's profile results are futures; the device
/// answers them).
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::yield_now();
    }
}

/// Device time per pass over `groups` windows of `per` passes each (median, min, max), and
/// the timing method Burn used; `None` when the device opens no windows or no window carried a
/// measurement.
fn device_time<K>(
    dev: &Device,
    groups: usize,
    per: usize,
    sync: &dyn Fn() -> Result<()>,
    enqueue: &mut impl FnMut() -> Result<K>,
) -> Result<Option<([f64; 3], String)>> {
    use burn::backend::{Backend, Dispatch, ProfileOptions};
    let fail = |e| anyhow::anyhow!("profile: {e:?}");
    let mut times = Vec::with_capacity(groups);
    let mut method = None;
    for _ in 0..groups {
        let Some(token) = Dispatch::profile_start(dev.as_dispatch()).map_err(fail)? else {
            return Ok(None);
        };
        let keep = (0..per).map(|_| enqueue()).collect::<Result<Vec<K>>>();
        let window =
            Dispatch::profile_end(dev.as_dispatch(), token, ProfileOptions::default().flush())
                .map_err(fail)?;
        let keep = keep?;
        sync()?;
        drop(keep);
        method = Some(format!("{:?}", window.timing_method()));
        if let Some(ticks) = block_on(window.resolve()) {
            times.push(ticks.duration().as_secs_f64() / per as f64);
        }
    }
    Ok(method
        .zip(Stats::of(times))
        .map(|(m, s)| ([s.median, s.min, s.max].map(|t| t * 1e3), m)))
}

/// The median of `v` (NaN when empty).
fn median(v: &[f64]) -> f64 {
    Stats::of(v.iter().copied()).map_or(f64::NAN, |s| s.median)
}

/// Runs `warmup` discarded passes (at least one, and more until `warmup_ms` have passed since
/// the first), then times `passes` passes; `enqueue` queues one pass and returns what must
/// stay alive until the sync.
#[allow(clippy::too_many_arguments)]
pub fn measure<K>(
    arm: &str,
    t: usize,
    matrices: usize,
    bytes: u64,
    a: &Args,
    timing: &Timing,
    mut enqueue: impl FnMut() -> Result<K>,
) -> Result<ArmResult> {
    let unix = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64())
    };
    let started = unix();
    let per = timing.per_sync.max(1);
    let mut group = |enq: &mut Vec<f64>, flushes: &mut Vec<f64>| -> Result<f64> {
        let start = Instant::now();
        let mut keep = Vec::with_capacity(per);
        for _ in 0..per {
            keep.push(enqueue()?);
        }
        let enqueued = start.elapsed().as_secs_f64();
        enq.push(enqueued / per as f64);
        if let Some(flush) = timing.flush {
            flush()?;
            flushes.push((start.elapsed().as_secs_f64() - enqueued) / per as f64);
        }
        (timing.sync)()?;
        let took = start.elapsed().as_secs_f64() / per as f64;
        drop(keep);
        Ok(took)
    };
    let (mut enq, mut flushes) = (Vec::new(), Vec::new());
    // The first group compiles the arm's shaders (seconds for the widest), so the clock that
    // has to climb back is timed from its end.
    group(&mut enq, &mut flushes)?;
    let warm = Instant::now();
    let mut done = per;
    while done < a.warmup || warm.elapsed().as_millis() < a.warmup_ms as u128 {
        group(&mut enq, &mut flushes)?;
        done += per;
    }
    enq.clear();
    flushes.clear();
    let times = (0..a.passes.div_ceil(per).max(1))
        .map(|_| group(&mut enq, &mut flushes))
        .collect::<Result<Vec<f64>>>()?;
    let Stats {
        median: med,
        min,
        max,
        ..
    } = Stats::of(times.iter().copied()).context("no timed pass")?;
    let device = match timing.profile {
        Some(dev) if matrices > 0 => device_time(
            dev,
            a.passes.div_ceil(per).max(1),
            per,
            timing.sync,
            &mut enqueue,
        )?,
        _ => None,
    };
    let gbps = |s: f64| bytes as f64 / s / 1e9;
    let r = ArmResult {
        arm: arm.to_string(),
        t,
        matrices,
        bytes_per_pass: bytes,
        passes: times.len() * per,
        median_ms: med * 1e3,
        min_ms: min * 1e3,
        max_ms: max * 1e3,
        gbps_median: gbps(med),
        gbps_best: gbps(min),
        gbps_worst: gbps(max),
        enqueue_ms: median(&enq) * 1e3,
        flush_ms: (!flushes.is_empty()).then(|| median(&flushes) * 1e3),
        passes_per_sync: per,
        device_ms: device.as_ref().map(|d| d.0[0]),
        device_min_ms: device.as_ref().map(|d| d.0[1]),
        device_max_ms: device.as_ref().map(|d| d.0[2]),
        device_timing: device.map(|d| d.1),
        span_unix_s: [started, unix()],
        tuning: timing.tuning.clone(),
    };
    eprintln!(
        "{:>6} T={:<2} x{:<2} {:>9.3} ms  {:>8.2} GB/s (best {:.2}, worst {:.2}) enqueue {:.3} ms, {} per sync{}{}{}",
        r.arm,
        r.t,
        r.matrices,
        r.median_ms,
        r.gbps_median,
        r.gbps_best,
        r.gbps_worst,
        r.enqueue_ms,
        per,
        r.tuning
            .as_deref()
            .map(|t| format!(", {t}"))
            .unwrap_or_default(),
        r.device_ms
            .map(|d| format!(", device {d:.3} ms"))
            .unwrap_or_default(),
        r.flush_ms
            .map(|f| format!(", flush {f:.3} ms"))
            .unwrap_or_default()
    );
    Ok(r)
}
