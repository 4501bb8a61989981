//! Time to model-ready, split into its phases, for the mapped store and the stock best (the
//! burnpack mapped and read through `ModuleRecord::from_bytes`), alternating in one process
//! with a warm page cache. A diagnostic beside the harness (which runs each arm in a fresh
//! process): it separates the manifest, the image build and `load_record`, and is the loop to
//! put under `perf record`.
//!
//! ```text
//! cargo run --release -p burn-mapped-benches --example model_ready -- [q8] [--iters N] [--arm mapped]
//! ```

use std::time::Instant;

use anyhow::Result;
use burn::tensor::Device;
use burn_mapped::{Manifest, MappedRecorder};
use burn_mapped_benches::arms::Arm;
use burn_mapped_benches::measure::ms;
use burn_mapped_benches::qwen::{self, QwenModel};
use burn_mapped_benches::stats::Stats;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let model = if args.iter().any(|a| a == "q8") {
        QwenModel::Q8
    } else {
        QwenModel::F32
    };
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
    };
    let iters: usize = flag("--iters").map_or(Ok(30), |s| s.parse())?;
    let only = flag("--arm").map(|s| Arm::parse(s).ok_or_else(|| anyhow::anyhow!("arm {s}")));
    let arms = match only {
        Some(arm) => vec![arm?],
        None => vec![Arm::Mapped, Arm::PackMapped],
    };
    let cache = burn_mapped_tools::fetch::default_cache_dir();
    let setup = qwen::prepare(&cache, &cache.join("bench"), model)?;
    let layout = setup.layout_path.as_deref();
    let device = Device::flex();

    let mut manifest = Vec::new();
    let mut record = Vec::new();
    let mut ready: Vec<Vec<f64>> = vec![Vec::new(); arms.len()];
    let mut construct: Vec<Vec<f64>> = vec![Vec::new(); arms.len()];
    for _ in 0..iters {
        if arms.contains(&Arm::Mapped) {
            // Each result is dropped after its time is taken: unmapping is not loading.
            let t = Instant::now();
            let parsed = std::hint::black_box(Manifest::read(&setup.files.store)?);
            manifest.push(ms(t));
            drop(parsed);
            let t = Instant::now();
            let loaded = std::hint::black_box(MappedRecorder::default().load(&setup.files.store)?);
            record.push(ms(t));
            drop(loaded);
        }
        for (k, &arm) in arms.iter().enumerate() {
            let loaded = qwen::load(arm, &setup.files, &setup.config_path, layout, &device)?;
            ready[k].push(loaded.model_ready_ms);
            construct[k].push(loaded.construct_ms);
        }
    }
    let line = |name: &str, v: &[f64]| {
        if let Some(s) = Stats::of(v.iter().copied()) {
            println!(
                "{name:<44} {:>8.3} ms  ({:.3}–{:.3})",
                s.median, s.min, s.max
            );
        }
    };
    println!("Qwen2.5 {model}, {iters} iterations, warm, one process; medians (min–max)");
    line("mapped: Manifest::read", &manifest);
    line("mapped: MappedRecorder::load (incl. manifest)", &record);
    for (k, arm) in arms.iter().enumerate() {
        line(
            &format!("{}: construct lazy module", arm.name()),
            &construct[k],
        );
        line(&format!("{}: model-ready", arm.name()), &ready[k]);
    }
    Ok(())
}
