//! The `gemv` benchmark: q8 products under the paper's matched protocol (§3.1) on Burn's own
//! stream, against the read ceiling and Burn's float and int8 matmuls. [`Args`] describes
//! the protocol and the arms (`gemv --help` prints it).
//!
//! ```text
//! cargo run --release -p burn-mapped-benches --bin gemv -- [--device flex|wgpu|vulkan]
//!     [--matrices 12] [--float-matrices 12] [--out 12288] [--in 7168] [--passes 30]
//!     [--warmup 12] [--warmup-ms 200] [--t-sweep 1,2,4,8] [--arms read,q8,f32,f16,burnq8]
//!     [--threads 0] [--store DIR] [--json FILE] [--per-sync 1] [--tunings 32.8.4.1.1,...]
//!     [--device-time] [--flush-first]
//! ```
//!
//! Modules: [`args`] (the command line), [`setup`] (device, store, operands), [`launch`]
//! (`--tunings`), [`read`] (the read ceiling, a kernel of the benchmark's own), [`timing`]
//! (how an arm is timed), [`arms`] (what the arms enqueue), [`report`] (table and JSON).

pub mod args;
pub mod arms;
pub mod launch;
pub mod read;
pub mod report;
pub mod setup;
pub mod timing;

use anyhow::{Context, Result, bail};
use burn::tensor::DType;
use burn_mapped::MappedStore;
use burn_mapped::q8::{Q8Weight, cpu_kernel_name};

pub use args::Args;
use arms::{burnq8_arm, float_arm, q8_pass, replay_arm};
use launch::LaunchSpec;
use read::read_weight;
use report::{PROTOCOL, Report};
use setup::{Rng, describe, device, ensure_store, name, random_x};
use timing::{Timing, measure};

/// Runs the arms `a` asks for and reports them.
pub fn run(a: Args) -> Result<()> {
    let a = a.checked()?;
    let dev = device(&a.device)?;
    let dir = ensure_store(&a)?;
    let store = MappedStore::open(&dir)?;
    let weights = (0..a.matrices)
        .map(|k| Q8Weight::from_store(&store, &name(k), &dev))
        .collect::<Result<Vec<_>, _>>()?;
    let specs = specs(&a, &weights[0])?;
    let q8_bytes: u64 = weights.iter().map(|w| w.bytes() as u64).sum();
    let value_bytes = (a.matrices * a.out * a.inp) as u64;
    let sync = || dev.sync().map_err(|e| anyhow::anyhow!("sync: {e:?}"));
    let flush = || dev.flush().map_err(|e| anyhow::anyhow!("flush: {e:?}"));
    let flush: Option<&dyn Fn() -> Result<()>> = a.flush_first.then_some(&flush);
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let mut arms = Vec::new();
    let mut skipped = Vec::new();
    let mut graph_checks = Vec::new();

    let timing = Timing {
        per_sync: 1,
        sync: &sync,
        flush,
        tuning: None,
        profile: a.device_time.then_some(&dev),
    };
    if a.runs("sync") {
        // The fixed cost of one sync with nothing queued: the floor under every pass.
        arms.push(measure("sync", 0, 0, 0, &a, &timing, || Ok(()))?);
    }
    // Each launch shape and each passes-per-sync count gets its own read and q8 arms, and
    // each shape its own q8graph arms. The arms after this loop run with the last shape.
    let mut tuned = weights.clone();
    let mut last = LaunchSpec::Default;
    for (spec, text) in specs {
        tuned = weights
            .iter()
            .map(|w| spec.apply(w, a.threads))
            .collect::<Result<Vec<_>, _>>()?;
        let tuning = spec.tuning(a.threads);
        let label = |t| spec.label(&tuned[0], t);
        for &per_sync in &a.per_sync {
            let timing = Timing {
                per_sync,
                ..timing.clone()
            };
            if a.runs("read") {
                arms.push(measure(
                    "read",
                    0,
                    a.matrices,
                    value_bytes,
                    &a,
                    &timing.labelled(label(0)),
                    || Ok(read_all(&tuned, &a, &spec)),
                )?);
            }
            for (arm, shared) in [("q8", None), ("q8shared", Some(tuning))] {
                if !a.runs(arm) {
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
                        &timing.labelled(label(t)),
                        || q8_pass(&x, &tuned, shared),
                    )?);
                }
            }
        }
        // Replays of the same passes per launch shape: they keep the GPU busy, so its clock
        // stays up, where eager arms let it idle between launches and slow down.
        for (arm, shared) in [("q8graph", None), ("q8sharedgraph", Some(tuning))] {
            if !a.runs(arm) {
                continue;
            }
            for &t in &a.t_sweep {
                let x = random_x(&mut rng, t, a.inp, &dev);
                let timing = timing.labelled(label(t));
                match replay_arm(arm, t, &x, &tuned, shared, &a, &timing, &text)? {
                    Some((r, check)) => {
                        arms.push(r);
                        graph_checks.push(check);
                    }
                    None => {
                        skipped.push(format!("{arm}: this device does not capture graphs"));
                        break;
                    }
                }
            }
        }
        last = spec;
    }
    // The read pass captured once with Burn's graph capture and replayed.
    if a.runs("readgraph") {
        let spec = last;
        let mut graph = burn::tensor::capture(&dev, || read_all(&tuned, &a, &spec));
        if graph.is_hardware() {
            arms.push(measure(
                "readgraph",
                0,
                a.matrices,
                value_bytes,
                &a,
                &timing.labelled(spec.label(&tuned[0], 0)),
                || {
                    // SAFETY: the graph reads the weights and writes its own outputs, all alive
                    // until the end of this function; nothing else uses them meanwhile, and
                    // every replay is followed by a sync on this thread's stream before the
                    // next.
                    unsafe { graph.replay() };
                    Ok(())
                },
            )?);
        } else {
            skipped.push("readgraph: this device does not capture graphs".into());
        }
    }
    let mut check = None;
    for (arm, dtype, size) in [("f32", DType::F32, 4u64), ("f16", DType::F16, 2)] {
        if !a.runs(arm) {
            continue;
        }
        let (r, err) = float_arm(
            arm,
            (dtype, size),
            &store,
            &tuned[0],
            &mut rng,
            &dev,
            &a,
            &timing,
        )?;
        check = check.or(err);
        match r {
            Ok(r) => arms.push(r),
            Err(why) => skipped.push(why),
        }
    }
    if a.runs("burnq8") {
        match burnq8_arm(&store, &mut rng, &dev, &a, &timing)? {
            Ok(r) => arms.push(r),
            Err(why) => skipped.push(why),
        }
    }

    let report = Report {
        protocol: PROTOCOL,
        device: describe(&dev),
        out: a.out,
        inp: a.inp,
        matrices: a.matrices,
        matrix_mb: (a.out * a.inp) as f64 / 1e6,
        host_threads: match a.threads {
            0 => burn_mapped::host::threads(),
            n => n,
        },
        host_kernel: cpu_kernel_name(),
        flex_matmul_threads: (a.device == "flex")
            .then_some("1 (the workspace builds burn-flex without its `rayon` feature)"),
        check_q8_vs_f32_max_rel_err: check,
        graph_checks,
        skipped,
        arms,
    };
    report.emit(a.json.as_deref())
}

/// The launch shapes to measure with their `--tunings` text: `--tunings` on a CubeCL device
/// (`default` if none), the defaults on the host. Every shape is checked before anything is
/// measured.
fn specs(a: &Args, w: &Q8Weight) -> Result<Vec<(LaunchSpec, String)>> {
    if w.planned_launch(1).is_none() {
        if !a.tunings.is_empty() {
            bail!("--tunings needs a CubeCL device (wgpu or vulkan)");
        }
        return Ok(vec![(LaunchSpec::Default, "default".into())]);
    }
    if a.tunings.is_empty() {
        return Ok(vec![(LaunchSpec::Default, "default".into())]);
    }
    a.tunings
        .iter()
        .map(|text| {
            let spec = LaunchSpec::parse(text)?;
            spec.apply(w, a.threads).with_context(|| {
                format!("--tunings: `{text}` is not a shape the kernels can run")
            })?;
            Ok((spec, text.clone()))
        })
        .collect()
}

/// One read pass: every weight's values read once, with the host slabs and GPU loads in
/// flight `spec` and `--threads` give.
fn read_all(
    weights: &[Q8Weight],
    a: &Args,
    spec: &LaunchSpec,
) -> Vec<burn::tensor::Tensor<1, burn::tensor::Int>> {
    weights
        .iter()
        .map(|w| read_weight(w, a.threads, spec.read_unroll()))
        .collect()
}
