//! GEMV benchmark under the paper's matched protocol (§3.1), on Burn's own stream.
//!
//! One pass = one product over each of `--matrices` distinct `[out, in]` int8 matrices
//! (default 12 x 12288 x 7168, 88.1 MB each, stored as a burn-mapped store and adopted from
//! the page cache on Flex) followed by one device sync. `--warmup` passes (12, at least one),
//! and more until `--warmup-ms` (200) have passed since the first (which compiles), are
//! discarded (a GPU drops its clock while the host compiles a shader, and compute-bound arms
//! measured before it climbs back ran up to 3x slow on the H200), then `--passes` (30) are
//! timed one by one; the report gives the median and the min/max. GB/s counts each arm's
//! weight bytes once per pass (int8 values + f16 scales for q8, 4 or 2 bytes per weight for
//! the float arms).
//!
//! Arms, all in one run: `read` (every weight byte read once, XOR, same threads or stream:
//! the ceiling), `q8` at every `T` of `--t-sweep` (1,2,4,8), Burn's float matmul `f32`
//! (and `f16` where the device supports it) at `T = 1` on the dequantized weights, computed
//! as `nn::Linear` with `LinearLayout::Col` computes it (`x @ W^T`, `W` stored `[out, in]`),
//! and `burnq8`: the same weights through Burn's own int8 quantization (default scheme) and
//! matmul at `T = 1` (bytes: one int8 per weight).
//!
//! ```text
//! cargo run --release -p burn-mapped-benches --bin gemv -- [--device flex|wgpu|vulkan]
//!     [--matrices 12] [--float-matrices 12] [--out 12288] [--in 7168] [--passes 30]
//!     [--warmup 12] [--warmup-ms 200] [--t-sweep 1,2,4,8] [--arms read,q8,f32,f16,burnq8]
//!     [--threads 0] [--store DIR] [--json FILE] [--per-sync 1] [--tunings 32.8.4.1.1,...]
//!     [--device-time] [--flush-first]
//! ```
//!
//! Diagnostics beyond the protocol: arm `sync` times one sync with nothing queued (the floor
//! under every pass); `--per-sync 1,10` adds read and q8 arms that queue several passes per
//! sync (times per pass), which separates a fixed per-sync cost from the kernels' own; every
//! arm also reports the host time spent enqueueing; `--flush-first` submits each pass (Burn's
//! `Device::flush`) before its sync and reports that submission's host time apart, so a pass
//! splits into enqueue, submission and the wait for the device's answer. `--device-time` (CubeCL devices) times each
//! arm's passes again, each inside one of Burn's profiling windows, and reports the device's
//! own clock per pass beside the wall time: what the GPU spent from its first kernel to its
//! last, without the host's encoding before submission or the wait for the sync's answer.
//! Arms `q8shared` and `q8sharedgraph` are `q8` and `q8graph` with the pass's 12 products on one
//! `Q8Input` (one activation split for all, where the dp4a kernel runs; elsewhere the same as
//! `q8`). Arms `readgraph` and `q8graph` (CubeCL devices) capture one pass with Burn's graph capture and
//! time replays of it (each + one sync), `q8graph` at every `T` of `--t-sweep` and every shape
//! of `--tunings` (replays keep the GPU busy, so its clock stays up; eager arms let it idle).
//! `--tunings` (CubeCL devices) measures the
//! read and q8 arms once per kernel launch shape: `lanes.groups.rows.unroll.read_unroll[.vector]`
//! for the FMA kernel at every `T` (see `burn_mapped::q8::CubeTuning`), `mma.blocks.splits.chunk`
//! for the tensor-core kernel at every `T` where the device has one (`burn_mapped::q8::MmaTuning`),
//! `dot.lanes.groups.rows.unroll` for the dp4a kernel at every `T` (`burn_mapped::q8::DotTuning`),
//! `default` for the per-`T` defaults. Each GPU arm reports the kernel and shape it ran.
//!
//! The wgpu device (WGSL, or SPIR-V where wgpu settles on Vulkan and `vulkan` is built in)
//! needs `--features wgpu`; the vulkan device (Burn's `vulkan` backend: wgpu pinned to
//! Vulkan, SPIR-V) needs `--features vulkan`. GPU weights are uploaded once and stay resident.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use burn::tensor::quantization::QuantScheme;
use burn::tensor::{DType, Device, Tensor, TensorData, f16};
use burn_mapped::MappedStore;
use burn_mapped::q8::{
    Q8Input, Q8Rows, Q8Weight, cpu_kernel_name, cpu_threads, dequantize_rows, q8_linear,
    q8_linear_input, read_weight, set_cpu_threads, write_q8_rows,
};
use serde::Serialize;

struct Args {
    device: String,
    matrices: usize,
    float_matrices: usize,
    out: usize,
    inp: usize,
    passes: usize,
    warmup: usize,
    warmup_ms: usize,
    t_sweep: Vec<usize>,
    arms: Vec<String>,
    threads: usize,
    store: Option<PathBuf>,
    json: Option<PathBuf>,
    per_sync: Vec<usize>,
    tunings: Vec<String>,
    device_time: bool,
    flush_first: bool,
}

fn parse_args() -> Result<Args> {
    let mut a = Args {
        device: "flex".into(),
        matrices: 12,
        float_matrices: usize::MAX,
        out: 12288,
        inp: 7168,
        passes: 30,
        warmup: 12,
        warmup_ms: 200,
        t_sweep: vec![1, 2, 4, 8],
        arms: ["read", "q8", "f32", "f16", "burnq8"]
            .map(String::from)
            .to_vec(),
        threads: 0,
        store: None,
        json: None,
        per_sync: vec![1],
        tunings: Vec::new(),
        device_time: false,
        flush_first: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        let num = |v: String| v.parse::<usize>().with_context(|| format!("{flag}: `{v}`"));
        match flag.as_str() {
            "--device" => a.device = value()?,
            "--matrices" => a.matrices = num(value()?)?,
            "--float-matrices" => a.float_matrices = num(value()?)?,
            "--out" => a.out = num(value()?)?,
            "--in" => a.inp = num(value()?)?,
            "--passes" => a.passes = num(value()?)?,
            "--warmup" => a.warmup = num(value()?)?,
            "--warmup-ms" => a.warmup_ms = num(value()?)?,
            "--threads" => a.threads = num(value()?)?,
            "--t-sweep" => a.t_sweep = usize_list(&flag, &value()?)?,
            "--arms" => a.arms = value()?.split(',').map(String::from).collect(),
            "--per-sync" => a.per_sync = usize_list(&flag, &value()?)?,
            "--tunings" => a.tunings = value()?.split(',').map(String::from).collect(),
            "--store" => a.store = Some(value()?.into()),
            "--json" => a.json = Some(value()?.into()),
            "--device-time" => a.device_time = true,
            "--flush-first" => a.flush_first = true,
            "-h" | "--help" => {
                println!(
                    "{}",
                    include_str!("gemv.rs")
                        .lines()
                        .take_while(|l| l.starts_with("//!"))
                        .collect::<Vec<_>>()
                        .join("\n")
                );
                std::process::exit(0);
            }
            other => bail!("unknown argument `{other}` (try --help)"),
        }
    }
    if a.matrices == 0 || a.passes == 0 || a.out == 0 || a.inp == 0 {
        bail!("--matrices, --passes, --out and --in must be positive");
    }
    if a.t_sweep.contains(&0) {
        bail!("--t-sweep: T must be positive");
    }
    if a.per_sync.contains(&0) {
        bail!("--per-sync: counts must be positive");
    }
    a.float_matrices = a.float_matrices.min(a.matrices);
    Ok(a)
}

/// A comma-separated list of counts, the value of `flag`.
fn usize_list(flag: &str, value: &str) -> Result<Vec<usize>> {
    value
        .split(',')
        .map(|s| s.parse().with_context(|| format!("{flag}: `{s}`")))
        .collect()
}

fn device(name: &str) -> Result<Device> {
    match name {
        "flex" => Ok(Device::flex()),
        // Opened here, so a missing adapter is an error rather than a panic on first use.
        #[cfg(feature = "wgpu")]
        "wgpu" => Device::wgpu_options().init().context("no wgpu device"),
        #[cfg(feature = "vulkan")]
        "vulkan" => Device::wgpu_options()
            .graphics_api(burn::tensor::wgpu::WgpuBackend::Vulkan)
            .init()
            .context("no Vulkan device"),
        other => bail!(
            "unknown or not compiled-in device `{other}` (flex; wgpu with --features wgpu; \
             vulkan with --features vulkan)"
        ),
    }
}

/// The device, its adapter and the runtime that compiles its kernels (for a GPU, e.g.
/// `cubecl<wgpu<spirv>>`: which shader compiler the figures are for).
fn describe(dev: &Device) -> String {
    use burn::backend::{Backend, Dispatch};
    let runtime = <Dispatch as Backend>::name(dev.as_dispatch());
    #[cfg(feature = "wgpu")]
    if let Some(id) = dev.identity() {
        return format!("{dev:?} `{}` {runtime}", id.name);
    }
    format!("{dev:?} {runtime}")
}

/// The q8 kernels' launch shapes to measure, as `lanes.groups.rows.unroll.read_unroll[.vector]`
/// or `default`: `--tunings` on a CubeCL device, else `default` (`None` on the host).
fn tunings(a: &Args, dev: &Device) -> Result<Vec<Option<String>>> {
    #[cfg(feature = "wgpu")]
    if on_cube(dev) {
        if a.tunings.is_empty() {
            return Ok(vec![Some("default".into())]);
        }
        // Every shape is checked (set, then reset) before anything is measured.
        for spec in &a.tunings {
            apply_tuning(spec)?;
        }
        burn_mapped::q8::reset_cube_tuning();
        return Ok(a.tunings.iter().cloned().map(Some).collect());
    }
    let _ = dev;
    if !a.tunings.is_empty() {
        bail!("--tunings needs a CubeCL device (wgpu or vulkan)");
    }
    Ok(vec![None])
}

/// The dot-separated counts of `spec`, if they are `lens` many (one of them).
#[cfg(feature = "wgpu")]
fn counts(spec: &str, lens: &[usize]) -> Option<Vec<usize>> {
    spec.split('.')
        .map(|s| s.parse::<usize>())
        .collect::<Result<Vec<_>, _>>()
        .ok()
        .filter(|v| lens.contains(&v.len()))
}

#[cfg(feature = "wgpu")]
fn parse_tuning(spec: &str) -> Result<burn_mapped::q8::CubeLaunch> {
    use burn_mapped::q8::{CubeLaunch, CubeTuning, DotTuning, MmaTuning};
    if let Some(rest) = spec.strip_prefix("dot.") {
        let v = counts(rest, &[4])
            .with_context(|| format!("--tunings: `{spec}` is not dot.lanes.groups.rows.unroll"))?;
        return Ok(CubeLaunch::Dot(DotTuning {
            lanes: v[0],
            groups: v[1],
            rows: v[2],
            unroll: v[3],
        }));
    }
    if let Some(rest) = spec.strip_prefix("mma.") {
        let v = counts(rest, &[3])
            .with_context(|| format!("--tunings: `{spec}` is not mma.blocks.splits.chunk"))?;
        return Ok(CubeLaunch::Mma(MmaTuning {
            blocks: v[0],
            splits: v[1],
            chunk: v[2],
        }));
    }
    let v = counts(spec, &[5, 6]).with_context(|| {
        format!("--tunings: `{spec}` is not lanes.groups.rows.unroll.read_unroll[.vector]")
    })?;
    Ok(CubeLaunch::Fma(CubeTuning {
        lanes: v[0],
        groups: v[1],
        rows: v[2],
        unroll: v[3],
        read_unroll: v[4],
        vector: v.get(5).copied().unwrap_or(4),
    }))
}

fn apply_tuning(spec: &str) -> Result<()> {
    #[cfg(feature = "wgpu")]
    {
        use burn_mapped::q8::{
            CubeLaunch, reset_cube_tuning, set_cube_tuning, set_dot_tuning, set_mma_tuning,
        };
        let set = match spec {
            "default" => {
                reset_cube_tuning();
                true
            }
            _ => match parse_tuning(spec)? {
                CubeLaunch::Fma(t) => set_cube_tuning(t),
                CubeLaunch::Mma(t) => set_mma_tuning(t),
                CubeLaunch::Dot(t) => set_dot_tuning(t),
            },
        };
        if !set {
            bail!("--tunings: `{spec}` is not a shape the kernels can run");
        }
        Ok(())
    }
    #[cfg(not(feature = "wgpu"))]
    bail!("--tunings `{spec}` needs a CubeCL device")
}

#[cfg(feature = "wgpu")]
fn on_cube(dev: &Device) -> bool {
    matches!(dev.as_dispatch(), burn::backend::DispatchDevice::Cube(_))
}

/// The kernel and launch shape a `t`-row product over rows of `inp` values uses now on
/// `dev` (`t = 0`: the read kernel, whose one field comes from the FMA shape of `t = 1`);
/// `None` off CubeCL devices, whose kernels have no shape.
fn shape_label(dev: &Device, t: usize, inp: usize) -> Option<String> {
    #[cfg(feature = "wgpu")]
    if on_cube(dev) {
        use burn_mapped::q8::{cube_tuning, planned_launch};
        return match t {
            0 => Some(cube_tuning(1).to_string()),
            t => planned_launch(dev, t, inp).map(|l| l.to_string()),
        };
    }
    let _ = (dev, t, inp);
    None
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn name(k: usize) -> String {
    format!("m{k:02}.weight")
}

/// The store of random q8 matrices, written once and reused (it is a cache).
fn ensure_store(a: &Args) -> Result<PathBuf> {
    let dir = match &a.store {
        Some(d) => d.clone(),
        None => {
            let home = std::env::var_os("HOME").context("HOME is not set; pass --store")?;
            PathBuf::from(home).join(format!(
                ".cache/burn-mapped/gemv/{}x{}x{}",
                a.out, a.inp, a.matrices
            ))
        }
    };
    if let Ok(store) = MappedStore::open(&dir) {
        let ok = (0..a.matrices).all(|k| {
            store
                .manifest()
                .get(&name(k))
                .is_some_and(|e| e.shape() == [a.out, a.inp] && e.quant().is_some())
        });
        if ok {
            return Ok(dir);
        }
    }
    eprintln!(
        "writing {} q8 matrices [{}, {}] to {}",
        a.matrices,
        a.out,
        a.inp,
        dir.display()
    );
    let mut writer = burn_mapped::StoreWriter::create(&dir)?;
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for k in 0..a.matrices {
        let values = (0..a.out * a.inp)
            .map(|_| (((rng.next() >> 32) % 255) as i32 - 127) as i8)
            .collect::<Vec<i8>>();
        let scales = (0..a.out)
            .map(|_| f16::from_f32(1e-3 * (1.0 + (rng.next() >> 40) as f32 / (1u64 << 24) as f32)))
            .collect();
        write_q8_rows(
            &mut writer,
            &name(k),
            &Q8Rows { values, scales },
            a.out,
            a.inp,
        )?;
    }
    writer.finish()?;
    Ok(dir)
}

#[derive(Serialize)]
struct ArmResult {
    arm: String,
    t: usize,
    matrices: usize,
    bytes_per_pass: u64,
    passes: usize,
    median_ms: f64,
    min_ms: f64,
    max_ms: f64,
    gbps_median: f64,
    gbps_best: f64,
    gbps_worst: f64,
    /// Median host time spent enqueueing a pass (before the sync).
    enqueue_ms: f64,
    /// With `--flush-first`: median host time of the submission between enqueue and sync.
    #[serde(skip_serializing_if = "Option::is_none")]
    flush_ms: Option<f64>,
    /// Passes enqueued per sync (1 under the protocol; more in diagnostic arms, whose times
    /// are per pass).
    passes_per_sync: usize,
    /// With `--device-time`: median device time per pass (the device's clock over a profiling
    /// window around the passes of one sync), and how Burn measured it (`Device` when the
    /// adapter has timestamp queries, else `System`: wall time between syncs).
    #[serde(skip_serializing_if = "Option::is_none")]
    device_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    device_min_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    device_max_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    device_timing: Option<String>,
    /// When the arm started and ended (Unix seconds), to line it up with clock samples.
    span_unix_s: [f64; 2],
    /// The GPU kernels' launch shape, for the q8, read and graph arms on a CubeCL device.
    #[serde(skip_serializing_if = "Option::is_none")]
    tuning: Option<String>,
}

/// How one arm is timed: `per_sync` passes of `enqueue`, then one sync, timed as a unit
/// and divided by `per_sync` (1 under the protocol). With `profile`, the passes are timed a
/// second time on the device's clock.
#[derive(Clone)]
struct Timing<'a> {
    per_sync: usize,
    sync: &'a dyn Fn() -> Result<()>,
    /// Submits what is enqueued without waiting (`--flush-first`), timed apart.
    flush: Option<&'a dyn Fn() -> Result<()>>,
    tuning: Option<String>,
    profile: Option<&'a Device>,
}

impl Timing<'_> {
    /// The same timing, labelled with the launch shape a `t`-row product over rows of `inp`
    /// values (`t = 0`: the read kernel) runs on `dev`.
    fn shaped(&self, dev: &Device, t: usize, inp: usize) -> Self {
        Timing {
            tuning: shape_label(dev, t, inp),
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
    Ok(method.filter(|_| !times.is_empty()).map(|m| {
        let med = median(&mut times);
        ([med, times[0], times[times.len() - 1]].map(|s| s * 1e3), m)
    }))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Runs `warmup` discarded passes (at least one, and more until `warmup_ms` have passed since
/// the first), then times `passes` passes; `enqueue` queues one pass and returns what must
/// stay alive until the sync.
#[allow(clippy::too_many_arguments)]
fn measure<K>(
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
    let mut times = (0..a.passes.div_ceil(per).max(1))
        .map(|_| group(&mut enq, &mut flushes))
        .collect::<Result<Vec<f64>>>()?;
    let med = median(&mut times);
    let (min, max) = (times[0], times[times.len() - 1]);
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
        enqueue_ms: median(&mut enq) * 1e3,
        flush_ms: (!flushes.is_empty()).then(|| median(&mut flushes) * 1e3),
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

/// One pass of q8 products of `x` over every weight: each through [`q8_linear`], or
/// (`shared`) all on one [`Q8Input`], whose activation split (dp4a kernel) they share.
fn q8_pass(x: &Tensor<2>, weights: &[Q8Weight], shared: bool) -> Result<Vec<Tensor<2>>> {
    let input = shared.then(|| Q8Input::new(x.clone()));
    Ok(weights
        .iter()
        .map(|w| match &input {
            Some(input) => q8_linear_input(input, w, None),
            None => q8_linear(x.clone(), w, None),
        })
        .collect::<Result<Vec<_>, _>>()?)
}

fn random_x(rng: &mut Rng, t: usize, inp: usize, device: &Device) -> Tensor<2> {
    let v: Vec<f32> = (0..t * inp)
        .map(|_| {
            let m = 0.1 + 0.9 * ((rng.next() >> 40) as f32 / (1u64 << 24) as f32);
            if rng.next() & 1 == 0 { m } else { -m }
        })
        .collect();
    Tensor::from_data(TensorData::new(v, [t, inp]), (device, DType::F32))
}

/// Dequantized f32 copy of a store matrix, built on the host and uploaded.
fn float_weight(store: &MappedStore, k: usize, a: &Args, device: &Device) -> Result<Tensor<2>> {
    let values: Vec<i8> = store
        .tensor_data(&name(k))?
        .try_to_vec()
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let link = store
        .manifest()
        .get(&name(k))
        .and_then(|e| e.quant())
        .context("q8 link")?;
    let scales: Vec<f16> = store
        .tensor_data(&link.scale)?
        .try_to_vec()
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let w = dequantize_rows(&values, &scales, a.out, a.inp)?;
    Ok(Tensor::from_data(
        TensorData::new(w, [a.out, a.inp]),
        (device, DType::F32),
    ))
}

/// Times `x @ w^T` over every `w` (one pass), or `None` when the first product panics (an op
/// this device's backend lacks).
fn matmul_arm(
    arm: &str,
    ws: &[Tensor<2>],
    x: &Tensor<2>,
    bytes: u64,
    a: &Args,
    timing: &Timing,
) -> Result<Option<ArmResult>> {
    let probe = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = x.clone().matmul(ws[0].clone().transpose()).into_data();
    }));
    if probe.is_err() {
        return Ok(None);
    }
    measure(arm, 1, ws.len(), bytes, a, timing, || {
        Ok(ws
            .iter()
            .map(|w| x.clone().matmul(w.clone().transpose()))
            .collect::<Vec<Tensor<2>>>())
    })
    .map(Some)
}

#[derive(Serialize)]
struct Report {
    protocol: &'static str,
    device: String,
    out: usize,
    inp: usize,
    matrices: usize,
    matrix_mb: f64,
    host_threads: usize,
    host_kernel: &'static str,
    flex_matmul_threads: Option<&'static str>,
    check_q8_vs_f32_max_rel_err: Option<f64>,
    /// For `q8graph`: whether the replayed outputs equal a fresh eager product, per `T`.
    graph_checks: Vec<String>,
    skipped: Vec<String>,
    arms: Vec<ArmResult>,
}

fn main() -> Result<()> {
    let a = parse_args()?;
    if a.threads > 0 {
        set_cpu_threads(a.threads);
    }
    let dev = device(&a.device)?;
    let dir = ensure_store(&a)?;
    let store = MappedStore::open(&dir)?;
    let weights = (0..a.matrices)
        .map(|k| Q8Weight::from_store(&store, &name(k), &dev))
        .collect::<Result<Vec<_>, _>>()?;
    let q8_bytes: u64 = weights.iter().map(|w| w.bytes() as u64).sum();
    let value_bytes = (a.matrices * a.out * a.inp) as u64;
    let sync = || dev.sync().map_err(|e| anyhow::anyhow!("sync: {e:?}"));
    let flush = || dev.flush().map_err(|e| anyhow::anyhow!("flush: {e:?}"));
    let flush: Option<&dyn Fn() -> Result<()>> = a.flush_first.then_some(&flush);
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let mut arms = Vec::new();
    let mut skipped = Vec::new();
    let mut check = None;
    let mut graph_checks = Vec::new();

    let timing = Timing {
        per_sync: 1,
        sync: &sync,
        flush,
        tuning: None,
        profile: a.device_time.then_some(&dev),
    };
    if a.arms.iter().any(|s| s == "sync") {
        // The fixed cost of one sync with nothing queued: the floor under every pass.
        arms.push(measure("sync", 0, 0, 0, &a, &timing, || Ok(()))?);
    }
    // Each tuning (GPU only) and each passes-per-sync count gets its own read and q8 arms, and
    // each tuning its own q8graph arms.
    for tuning in tunings(&a, &dev)? {
        if let Some(spec) = &tuning {
            apply_tuning(spec)?;
        }
        for &per_sync in &a.per_sync {
            let timing = Timing {
                per_sync,
                sync: &sync,
                flush,
                tuning: None,
                profile: a.device_time.then_some(&dev),
            };
            if a.arms.iter().any(|s| s == "read") {
                arms.push(measure(
                    "read",
                    0,
                    a.matrices,
                    value_bytes,
                    &a,
                    &timing.shaped(&dev, 0, a.inp),
                    || Ok(weights.iter().map(read_weight).collect::<Vec<_>>()),
                )?);
            }
            for (arm, shared) in [("q8", false), ("q8shared", true)] {
                if !a.arms.iter().any(|s| s == arm) {
                    continue;
                }
                for &t in &a.t_sweep {
                    let x = random_x(&mut rng, t, a.inp, &dev);
                    arms.push(measure(
                        arm,
                        t,
                        a.matrices,
                        q8_bytes,
                        &a,
                        &timing.shaped(&dev, t, a.inp),
                        || q8_pass(&x, &weights, shared),
                    )?);
                }
            }
        }
        // Replays of the same passes per launch shape: they keep the GPU busy, so its clock
        // stays up, where eager arms let it idle between launches and slow down.
        for (arm, shared) in [("q8graph", false), ("q8sharedgraph", true)] {
            if !a.arms.iter().any(|s| s == arm) {
                continue;
            }
            for &t in &a.t_sweep {
                let x = random_x(&mut rng, t, a.inp, &dev);
                let mut graph = burn::tensor::capture(&dev, || q8_pass(&x, &weights, shared));
                if !graph.is_hardware() {
                    skipped.push(format!("{arm}: this device does not capture graphs"));
                    break;
                }
                graph
                    .output()
                    .as_ref()
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                let replay = || {
                    // SAFETY: as for `readgraph`; `x` is declared before `graph`, so it
                    // outlives it.
                    unsafe { graph.replay() };
                    Ok(())
                };
                let shaped = timing.shaped(&dev, t, a.inp);
                arms.push(measure(arm, t, a.matrices, q8_bytes, &a, &shaped, replay)?);
                // The replays rewrote the captured outputs; they must equal a fresh eager product.
                let replayed = graph
                    .output()
                    .as_ref()
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                let same = q8_pass(&x, &weights, shared)?
                    .into_iter()
                    .zip(replayed)
                    .all(|(e, y)| e.into_data() == y.clone().into_data());
                let label = tuning.as_deref().unwrap_or("default");
                graph_checks.push(format!(
                    "{arm} {label} T={t}: replayed outputs equal eager: {same}"
                ));
                if !same {
                    bail!("{arm} {label} T={t}: replayed outputs differ from the eager product");
                }
            }
        }
    }
    // The same passes captured once with Burn's graph capture (`burn::tensor::capture`) and
    // replayed: the recorded launches are re-encoded from prebuilt state, without the per-launch
    // host work of Burn's dispatch, Fusion and CubeCL's launch path.
    if a.arms.iter().any(|s| s == "readgraph") {
        let mut graph =
            burn::tensor::capture(&dev, || weights.iter().map(read_weight).collect::<Vec<_>>());
        if graph.is_hardware() {
            arms.push(measure(
                "readgraph",
                0,
                a.matrices,
                value_bytes,
                &a,
                &timing.shaped(&dev, 0, a.inp),
                || {
                    // SAFETY: the graph reads the weights and writes its own outputs, all alive
                    // until the end of `main`; nothing else uses them meanwhile, and every replay
                    // is followed by a sync on this thread's stream before the next.
                    unsafe { graph.replay() };
                    Ok(())
                },
            )?);
        } else {
            skipped.push("readgraph: this device does not capture graphs".into());
        }
    }
    for (arm, dtype, size) in [("f32", DType::F32, 4u64), ("f16", DType::F16, 2)] {
        if !a.arms.iter().any(|s| s == arm) {
            continue;
        }
        if !dev.supports_dtype(dtype) {
            skipped.push(format!("{arm}: device does not support {dtype:?}"));
            continue;
        }
        let n = a.float_matrices;
        let ws = (0..n)
            .map(|k| {
                let w = float_weight(&store, k, &a, &dev)?;
                Ok(if dtype == DType::F32 {
                    w
                } else {
                    w.cast(dtype)
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let x = random_x(&mut rng, 1, a.inp, &dev).cast(dtype);
        if dtype == DType::F32 {
            let want: Vec<f32> = x
                .clone()
                .matmul(ws[0].clone().transpose())
                .into_data()
                .try_to_vec()
                .map_err(|e| anyhow::anyhow!("{e:?}"))?;
            let got: Vec<f32> = q8_linear(x.clone(), &weights[0], None)?
                .into_data()
                .try_to_vec()
                .map_err(|e| anyhow::anyhow!("{e:?}"))?;
            let scale = want.iter().fold(0f64, |m, v| m.max(f64::from(v.abs())));
            let err = got
                .iter()
                .zip(&want)
                .fold(0f64, |m, (g, w)| m.max(f64::from((g - w).abs())));
            check = Some(err / scale);
        }
        let bytes = n as u64 * (a.out * a.inp) as u64 * size;
        match matmul_arm(arm, &ws, &x, bytes, &a, &timing)? {
            Some(r) => arms.push(r),
            None => skipped.push(format!("{arm}: matmul panicked on this device")),
        }
    }

    if a.arms.iter().any(|s| s == "burnq8") {
        // Burn's own int8 quantization (its default scheme: symmetric, one f32 scale per
        // tensor, values packed four per u32) of the same dequantized weights, multiplied by
        // whatever Burn's matmul does with a quantized right-hand side on this device.
        let n = a.float_matrices;
        let scheme = QuantScheme::default();
        let ws = (0..n)
            .map(|k| Ok(float_weight(&store, k, &a, &dev)?.quantize_dynamic(&scheme)))
            .collect::<Result<Vec<_>>>()?;
        let x = random_x(&mut rng, 1, a.inp, &dev);
        let bytes = n as u64 * (a.out * a.inp) as u64;
        match matmul_arm("burnq8", &ws, &x, bytes, &a, &timing)? {
            Some(r) => arms.push(r),
            None => skipped.push("burnq8: Burn's quantized matmul panicked on this device".into()),
        }
    }

    let report = Report {
        protocol: "one pass = one product per matrix + one sync; warm-up passes discarded; median and min/max over timed passes; GB/s counts weight bytes once",
        device: describe(&dev),
        out: a.out,
        inp: a.inp,
        matrices: a.matrices,
        matrix_mb: (a.out * a.inp) as f64 / 1e6,
        host_threads: cpu_threads(),
        host_kernel: cpu_kernel_name(),
        flex_matmul_threads: (a.device == "flex")
            .then_some("1 (the workspace builds burn-flex without its `rayon` feature)"),
        check_q8_vs_f32_max_rel_err: check,
        graph_checks,
        skipped,
        arms,
    };
    println!(
        "| arm    | T  | matrices | MB/pass | median ms | min ms | max ms | GB/s (median) | GB/s (best) | enqueue ms | device ms | per sync | tuning |"
    );
    println!(
        "|--------|----|----------|---------|-----------|--------|--------|---------------|-------------|------------|-----------|----------|--------|"
    );
    for r in &report.arms {
        println!(
            "| {:<6} | {:<2} | {:<8} | {:>7.1} | {:>9.3} | {:>6.3} | {:>6.3} | {:>13.2} | {:>11.2} | {:>10.3} | {:>9} | {:>8} | {} |",
            r.arm,
            r.t,
            r.matrices,
            r.bytes_per_pass as f64 / 1e6,
            r.median_ms,
            r.min_ms,
            r.max_ms,
            r.gbps_median,
            r.gbps_best,
            r.enqueue_ms,
            r.device_ms
                .map(|d| format!("{d:.3}"))
                .unwrap_or_else(|| "-".into()),
            r.passes_per_sync,
            r.tuning.as_deref().unwrap_or("-")
        );
    }
    println!(
        "device {}, host threads {} ({}), q8 vs f32 max rel err {:?}, skipped {:?}",
        report.device,
        report.host_threads,
        report.host_kernel,
        report.check_q8_vs_f32_max_rel_err,
        report.skipped
    );
    let json = serde_json::to_string_pretty(&report)?;
    match &a.json {
        Some(path) => {
            std::fs::write(path, json).with_context(|| format!("write {}", path.display()))?
        }
        None => println!("{json}"),
    }
    Ok(())
}
