//! Throughput of the GGUF block products on the host (`burn_mapped::blocks`) at small `T`,
//! against a plain read of the same bytes with the same threads.
//!
//! ```text
//! cargo run --release -p burn-mapped-benches --bin blocks -- [--passes 30] [--warmup 3]
//!     [--t-sweep 1,2,4,8] [--set-mb 128] [--head-rows 151936] [--threads 0]
//!     [--cases q5_0-ffn,q5_0-attn,q8_0-head,q4_k-down,q6_k-down] [--max-rows N] [--json FILE]
//! ```
//!
//! Every case is a block matrix of one type in a shape of Qwen2.5-0.5B (hidden 896, FFN
//! 4864, vocabulary 151936), random values with small positive f16 scales. A case holds as
//! many distinct copies as make up `--set-mb` (at least one), so a pass, one product per copy
//! in turn, reads its bytes from DRAM as a decode step does. Each timed pass runs every arm of
//! a case once, in turn: `read` (every weight byte XORed, split like the products' slabs) and
//! `blocks` at each `T` (`block_linear_input` on activations quantized beforehand). GB/s
//! counts the weight bytes once per pass; the ratio is to the read's median. Each pass is
//! also timed on the process's CPU clock (all threads): on a shared machine, where other
//! work takes turns on the cores, bytes per CPU-second still compares kernels (idle pool
//! threads spinning while they wait count too, alike for every arm).

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use burn::backend::Flex;
use burn::tensor::{DType, Device, Int, Tensor, TensorData, f16};
use burn_mapped::blocks::{BlockInput, BlockLayout, BlockWeight, block_linear_input};
use burn_mapped::gguf::{GgmlType, dequantize_to_vec, scale_offsets};
use burn_mapped_benches::gemv::read::read_xor;
use burn_mapped_benches::gemv::setup::Rng;
use burn_mapped_benches::stats::Stats;
use clap::Parser;
use serde::Serialize;

/// Block products at small T against the read ceiling (see the module docs).
#[derive(Debug, Parser)]
#[command(name = "blocks", verbatim_doc_comment)]
struct Args {
    /// Timed passes (each runs every arm of a case once).
    #[arg(long, default_value_t = 30)]
    passes: usize,
    /// Discarded passes before them.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Activation rows of the `blocks` arms.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 2, 4, 8])]
    t_sweep: Vec<usize>,
    /// Least bytes of distinct copies per case, in MiB (the cache is passed through).
    #[arg(long, default_value_t = 128)]
    set_mb: usize,
    /// Rows of the Q8_0 LM head (151936 is Qwen2.5's whole vocabulary).
    #[arg(long, default_value_t = 151_936)]
    head_rows: usize,
    /// Caps every case's output rows (with `--set-mb 0`, small enough for the matrix to stay
    /// in L2: the kernels' compute alone).
    #[arg(long)]
    max_rows: Option<usize>,
    /// Threads of the products (burn-mapped's pool, as `BURN_MAPPED_THREADS` sets it) and of
    /// the read (rayon's global pool); 0: one per CPU.
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Cases to run: q5_0-ffn, q5_0-attn, q8_0-head, q8_0-attn, q4_k-down, q6_k-down.
    #[arg(long, value_delimiter = ',', default_values_t =
        ["q5_0-ffn", "q5_0-attn", "q8_0-head", "q4_k-down", "q6_k-down"].map(String::from))]
    cases: Vec<String>,
    /// Writes the JSON report here instead of standard output.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// A block type in one shape.
struct Case {
    name: &'static str,
    ty: GgmlType,
    out: usize,
    inp: usize,
}

fn cases(a: &Args) -> Result<Vec<Case>> {
    let all = [
        ("q5_0-ffn", GgmlType::Q5_0, 4864, 896),
        ("q5_0-attn", GgmlType::Q5_0, 896, 896),
        ("q8_0-head", GgmlType::Q8_0, a.head_rows, 896),
        ("q8_0-attn", GgmlType::Q8_0, 128, 896),
        ("q4_k-down", GgmlType::Q4_K, 896, 4864),
        ("q6_k-down", GgmlType::Q6_K, 896, 4864),
    ];
    a.cases
        .iter()
        .map(|c| {
            all.iter()
                .find(|(n, ..)| n == c)
                .map(|&(name, ty, out, inp)| Case {
                    name,
                    ty,
                    out: a.max_rows.map_or(out, |m| out.min(m.max(1))),
                    inp,
                })
                .with_context(|| format!("unknown case `{c}`"))
        })
        .collect()
}

/// `out` random rows of `ty`, each f16 scale in `[1e-3, 2e-3)`: finite, the size of a
/// trained model's.
fn random_blocks(ty: GgmlType, out: usize, inp: usize, rng: &mut Rng) -> Result<Vec<u8>> {
    let layout = BlockLayout::new(ty, inp).map_err(anyhow::Error::msg)?;
    let mut bytes = vec![0u8; out * layout.row_bytes()];
    for word in bytes.chunks_mut(8) {
        let r = rng.next_u64().to_le_bytes();
        word.copy_from_slice(&r[..word.len()]);
    }
    for block in bytes.chunks_exact_mut(ty.type_size() as usize) {
        for &at in scale_offsets(ty) {
            let s = f16::from_f32(1e-3 * (1.0 + rng.unit()));
            block[at..at + 2].copy_from_slice(&s.to_bits().to_le_bytes());
        }
    }
    Ok(bytes)
}

/// One arm's timings.
#[derive(Serialize)]
struct Arm {
    arm: &'static str,
    t: usize,
    median_ms: f64,
    min_ms: f64,
    max_ms: f64,
    gbps_median: f64,
    gbps_min: f64,
    gbps_max: f64,
    /// Median GB/s over the read's.
    ratio_to_read: f64,
    /// Weight bytes per second of process CPU time (all threads), median over passes.
    gb_per_cpu_s: f64,
}

#[derive(Serialize)]
struct CaseReport {
    case: &'static str,
    ty: &'static str,
    out: usize,
    inp: usize,
    matrix_mb: f64,
    copies: usize,
    /// `max |y - y_f64| / max |y_f64|` over the first copy's first rows, `y_f64` from the
    /// dequantized weights and the unquantized activations: a sanity check (the activations'
    /// 8-bit rounding alone gives ~1e-2).
    check_rel_err: f64,
    arms: Vec<Arm>,
}

#[derive(Serialize)]
struct Report {
    protocol: &'static str,
    kernel: &'static str,
    threads: usize,
    passes: usize,
    set_mb: usize,
    cases: Vec<CaseReport>,
}

const PROTOCOL: &str = "one pass = one product (or read) per distinct copy, arms of a case interleaved per pass; warm-up passes discarded; median and min/max over timed passes; GB/s counts weight bytes once";

/// The products of the first `rows` rows of `w` against `x` in f64 (`x` unquantized).
fn check(
    case: &Case,
    w: &BlockWeight,
    bytes: &[u8],
    x: &[f32],
    t: usize,
    input: &BlockInput,
) -> Result<f64> {
    let rows = case.out.min(64);
    let layout = w.layout();
    let wf = dequantize_to_vec(case.ty, &bytes[..rows * layout.row_bytes()])?;
    let y: Vec<f32> = block_linear_input(input, w, None)?
        .into_data()
        .try_to_vec()
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let (mut err, mut scale) = (0f64, 0f64);
    for tt in 0..t {
        for o in 0..rows {
            let want: f64 = (0..case.inp)
                .map(|i| f64::from(wf[o * case.inp + i]) * f64::from(x[tt * case.inp + i]))
                .sum();
            err = err.max((f64::from(y[tt * case.out + o]) - want).abs());
            scale = scale.max(want.abs());
        }
    }
    Ok(err / scale.max(f64::MIN_POSITIVE))
}

fn run_case(a: &Args, case: &Case, device: &Device, rng: &mut Rng) -> Result<CaseReport> {
    let layout = BlockLayout::new(case.ty, case.inp).map_err(anyhow::Error::msg)?;
    let matrix_bytes = case.out * layout.row_bytes();
    let copies = (a.set_mb << 20).div_ceil(matrix_bytes).max(1);
    let mut weights = Vec::with_capacity(copies);
    let mut first = Vec::new();
    for k in 0..copies {
        let bytes = random_blocks(case.ty, case.out, case.inp, rng)?;
        if k == 0 {
            first = bytes.clone();
        }
        let t = Tensor::<2, Int>::from_data(
            TensorData::new(bytes, [case.out, layout.row_bytes()]),
            (device, DType::U8),
        );
        weights.push(BlockWeight::new(t, layout)?);
    }
    // The bytes the products read, in place.
    let prims: Vec<_> = weights
        .iter()
        .map(|w| {
            w.bytes()
                .clone()
                .try_into_primitive::<Flex>()
                .map_err(|_| anyhow::anyhow!("weights not on Flex"))
        })
        .collect::<Result<_>>()?;
    let slices: Vec<&[u8]> = prims
        .iter()
        .map(|p| p.as_slice::<u8>().context("u8 weights"))
        .collect::<Result<_>>()?;

    let mut inputs = Vec::new();
    let mut check_rel_err = 0f64;
    for &t in &a.t_sweep {
        let x: Vec<f32> = (0..t * case.inp).map(|_| rng.signed()).collect();
        let input = BlockInput::new(Tensor::<2>::from_data(
            TensorData::new(x.clone(), [t, case.inp]),
            device,
        ))?;
        check_rel_err = check_rel_err.max(check(case, &weights[0], &first, &x, t, &input)?);
        inputs.push((t, input));
    }
    drop(first);

    // Arm 0 is the read, arm 1 + i the products at `t_sweep[i]`.
    let arms = 1 + inputs.len();
    let mut times = vec![Vec::with_capacity(a.passes); arms];
    let mut cpu = vec![Vec::with_capacity(a.passes); arms];
    let mut sink = 0u64;
    for pass in 0..a.warmup + a.passes {
        for (arm, (slot, cpu)) in times.iter_mut().zip(cpu.iter_mut()).enumerate() {
            let cpu0 = cpu_seconds();
            let start = Instant::now();
            if arm == 0 {
                for s in &slices {
                    sink ^= read_xor(s, 0).iter().fold(0u64, |x, &w| x ^ u64::from(w));
                }
            } else {
                let input = &inputs[arm - 1].1;
                for w in &weights {
                    black_box(block_linear_input(input, w, None)?);
                }
            }
            let secs = start.elapsed().as_secs_f64();
            let cpu_secs = cpu_seconds() - cpu0;
            if pass >= a.warmup {
                slot.push(secs);
                cpu.push(cpu_secs);
            }
        }
    }
    black_box(sink);

    let pass_bytes = (copies * matrix_bytes) as f64;
    let stats = |ts: &[f64]| Stats::of(ts.iter().copied()).expect("timed passes");
    let read_gbps = pass_bytes / stats(&times[0]).median / 1e9;
    let arms = times
        .iter()
        .zip(&cpu)
        .enumerate()
        .map(|(arm, (ts, cpu))| {
            let s = stats(ts);
            let gbps = pass_bytes / s.median / 1e9;
            Arm {
                arm: if arm == 0 { "read" } else { "blocks" },
                t: if arm == 0 { 0 } else { inputs[arm - 1].0 },
                median_ms: s.median * 1e3,
                min_ms: s.min * 1e3,
                max_ms: s.max * 1e3,
                gbps_median: gbps,
                gbps_min: pass_bytes / s.max / 1e9,
                gbps_max: pass_bytes / s.min / 1e9,
                ratio_to_read: gbps / read_gbps,
                gb_per_cpu_s: pass_bytes / stats(cpu).median / 1e9,
            }
        })
        .collect();
    Ok(CaseReport {
        case: case.name,
        ty: case.ty.name(),
        out: case.out,
        inp: case.inp,
        matrix_mb: matrix_bytes as f64 / 1e6,
        copies,
        check_rel_err,
        arms,
    })
}

/// CPU time of the whole process so far, in seconds.
fn cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to write.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID)");
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn main() -> Result<()> {
    let a = Args::parse();
    if a.passes == 0 || a.t_sweep.contains(&0) {
        bail!("--passes and every T must be positive");
    }
    if a.threads > 0 {
        // SAFETY: no other thread exists yet (burn-mapped's and rayon's pools start on first
        // use, below), so nothing reads the environment concurrently.
        unsafe { std::env::set_var(burn_mapped::host::THREADS_VAR, a.threads.to_string()) };
        rayon::ThreadPoolBuilder::new()
            .num_threads(a.threads)
            .build_global()
            .context("rayon pool")?;
    }
    let device = Device::flex();
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let mut reports = Vec::new();
    for case in cases(&a)? {
        reports.push(run_case(&a, &case, &device, &mut rng)?);
    }
    let report = Report {
        protocol: PROTOCOL,
        kernel: burn_mapped::blocks::cpu_kernel_name(),
        threads: burn_mapped::host::threads(),
        passes: a.passes,
        set_mb: a.set_mb,
        cases: reports,
    };

    println!(
        "| case      | type | shape        | copies | arm    | T | GB/s median (min-max) | x read | GB/CPU-s |"
    );
    println!(
        "|-----------|------|--------------|--------|--------|---|-----------------------|--------|----------|"
    );
    for c in &report.cases {
        for r in &c.arms {
            println!(
                "| {:<9} | {:<4} | {:>12} | {:>6} | {:<6} | {} | {:>6.2} ({:>6.2}-{:>6.2}) | {:>6.3} | {:>8.2} |",
                c.case,
                c.ty,
                format!("{}x{}", c.out, c.inp),
                c.copies,
                r.arm,
                if r.t == 0 {
                    "-".into()
                } else {
                    r.t.to_string()
                },
                r.gbps_median,
                r.gbps_min,
                r.gbps_max,
                r.ratio_to_read,
                r.gb_per_cpu_s
            );
        }
    }
    println!(
        "kernel {}, threads {}, checks (rel err vs f64): {}",
        report.kernel,
        report.threads,
        report
            .cases
            .iter()
            .map(|c| format!("{} {:.1e}", c.case, c.check_rel_err))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let text = serde_json::to_string_pretty(&report)?;
    match &a.json {
        Some(path) => {
            std::fs::write(path, text).with_context(|| format!("write {}", path.display()))?
        }
        None => println!("{text}"),
    }
    Ok(())
}
