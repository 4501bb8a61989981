//! Time to a ready model for a >= 1 GiB stack of `Linear` layers stored three ways:
//!
//! - `mapped`: a burn-mapped store, loaded with `MappedRecorder::load` + `load_record`;
//! - `load_file`: Burn's burnpack via `Module::load_file`;
//! - `safetensors`: burn-store's `SafetensorsStore` via `load_from`.
//!
//! Each measurement runs in a fresh process (this binary re-executed with `--arm`), with the
//! page cache warmed by reading the arm's files just before, and arm order alternating between
//! rounds. "Ready" is: construct the lazily initialized module, load it, and run one token
//! through every layer (which reads every weight). The child also reports its resident set
//! (anonymous vs file-backed) after loading and after the forward pass.
//!
//! ```text
//! cargo run --release -p burn-mapped-benches --bin load_time -- [--dir D] [--rounds 5]
//!     [--layers 64] [--dim 2048] [--json out.json]
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use burn::module::Module;
use burn::nn::{Linear, LinearConfig, LinearLayout};
use burn::store::{ModuleSnapshot, SafetensorsStore};
use burn::tensor::{Device, Tensor, TensorData};
use burn_mapped::MappedRecorder;
use burn_mapped::memstat::rss_self;
use serde::{Deserialize, Serialize};

#[derive(Module, Debug)]
struct Stack {
    layers: Vec<Linear>,
}

impl Stack {
    /// Lazily initialized: no weight is generated until read (or replaced by a load).
    fn init(layers: usize, dim: usize, device: &Device) -> Self {
        Self {
            layers: (0..layers)
                .map(|_| {
                    LinearConfig::new(dim, dim)
                        .with_layout(LinearLayout::Col)
                        .init(device)
                })
                .collect(),
        }
    }

    /// One token through every layer; returns the sum of the output (a checksum that must agree
    /// across arms).
    fn forward_one(&self, dim: usize, device: &Device) -> f64 {
        let input: Vec<f32> = (0..dim).map(|i| ((i % 17) as f32 - 8.0) / 8.0).collect();
        let mut x = Tensor::<2>::from_data(TensorData::new(input, [1, dim]), device);
        for layer in &self.layers {
            x = layer.forward(x).tanh();
        }
        let out = x.into_data().try_to_vec::<f32>().expect("f32 output");
        out.iter().map(|&v| f64::from(v)).sum()
    }
}

const ARMS: [&str; 3] = ["mapped", "load_file", "safetensors"];

struct Args {
    dir: Option<PathBuf>,
    rounds: usize,
    layers: usize,
    dim: usize,
    arm: Option<String>,
    json: Option<PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        dir: None,
        rounds: 5,
        layers: 64,
        dim: 2048,
        arm: None,
        json: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--dir" => args.dir = Some(PathBuf::from(value()?)),
            "--rounds" => args.rounds = value()?.parse().map_err(|e| format!("--rounds: {e}"))?,
            "--layers" => args.layers = value()?.parse().map_err(|e| format!("--layers: {e}"))?,
            "--dim" => args.dim = value()?.parse().map_err(|e| format!("--dim: {e}"))?,
            "--arm" => args.arm = Some(value()?),
            "--json" => args.json = Some(PathBuf::from(value()?)),
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    Ok(args)
}

/// Resident set sizes in bytes (from `burn_mapped::memstat::Rss`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Rss {
    anon: u64,
    file: u64,
    peak: u64,
}

fn rss_now() -> Result<Rss, String> {
    let r = rss_self().map_err(|e| e.to_string())?;
    Ok(Rss {
        anon: r.anon,
        file: r.file,
        peak: r.peak,
    })
}

/// One child's measurement.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Sample {
    arm: String,
    round: usize,
    /// Construct + load + first forward, timed inside the child.
    ready_ms: f64,
    construct_ms: f64,
    load_ms: f64,
    forward_ms: f64,
    /// Spawn to exit, timed by the parent (includes exec and process teardown).
    process_ms: f64,
    rss_after_load: Rss,
    rss_after_forward: Rss,
    checksum: f64,
}

fn paths(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    (
        dir.join("mapped"),
        dir.join("model.bpk"),
        dir.join("model.safetensors"),
    )
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

/// Child side: load one arm and print one JSON line.
fn child(arm: &str, args: &Args) -> Result<(), String> {
    let dir = args.dir.as_ref().ok_or("--arm needs --dir")?;
    let (mapped, bpk, st) = paths(dir);
    let device = Device::flex();
    let start = Instant::now();
    let fresh = Stack::init(args.layers, args.dim, &device);
    let construct_ms = ms(start);
    let t = Instant::now();
    let model = match arm {
        "mapped" => {
            let record = MappedRecorder::default()
                .load(&mapped)
                .map_err(|e| e.to_string())?;
            fresh.load_record(record)
        }
        "load_file" => fresh.try_load_file(&bpk).map_err(|e| e.to_string())?,
        "safetensors" => {
            let mut model = fresh;
            model
                .load_from(&mut SafetensorsStore::from_file(&st))
                .map_err(|e| e.to_string())?;
            model
        }
        other => return Err(format!("unknown arm `{other}`")),
    };
    let load_ms = ms(t);
    let rss_after_load = rss_now()?;
    let t = Instant::now();
    let checksum = model.forward_one(args.dim, &device);
    let forward_ms = ms(t);
    let ready_ms = ms(start);
    let rss_after_forward = rss_now()?;
    let sample = Sample {
        arm: arm.to_string(),
        round: 0,
        ready_ms,
        construct_ms,
        load_ms,
        forward_ms,
        process_ms: 0.0,
        rss_after_load,
        rss_after_forward,
        checksum,
    };
    println!(
        "{}",
        serde_json::to_string(&sample).map_err(|e| e.to_string())?
    );
    Ok(())
}

/// Reads every file under `path` once so the measurement starts from a warm page cache.
fn warm(path: &Path) -> std::io::Result<u64> {
    use std::io::Read;
    let mut total = 0;
    let files: Vec<PathBuf> = if path.is_dir() {
        std::fs::read_dir(path)?
            .map(|e| e.map(|e| e.path()))
            .collect::<Result<_, _>>()?
    } else {
        vec![path.to_path_buf()]
    };
    let mut buf = vec![0u8; 1 << 20];
    for file in files {
        let mut f = std::fs::File::open(file)?;
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            total += n as u64;
        }
    }
    Ok(total)
}

fn size_of(path: &Path) -> std::io::Result<u64> {
    if path.is_dir() {
        std::fs::read_dir(path)?.try_fold(0, |acc, e| Ok(acc + e?.metadata()?.len()))
    } else {
        Ok(std::fs::metadata(path)?.len())
    }
}

fn write_inputs(args: &Args, dir: &Path) -> Result<f64, String> {
    let (mapped, bpk, st) = paths(dir);
    let device = Device::flex();
    let model = Stack::init(args.layers, args.dim, &device);
    let t = Instant::now();
    // Materialize the weights once, so the three writers save the same values.
    let checksum = model.forward_one(args.dim, &device);
    eprintln!("initialized weights in {:.1} s", t.elapsed().as_secs_f64());
    let t = Instant::now();
    MappedRecorder::default()
        .record(&model, &mapped)
        .map_err(|e| e.to_string())?;
    model
        .clone()
        .into_record()
        .save(&bpk)
        .map_err(|e| e.to_string())?;
    model
        .clone()
        .save_into(&mut SafetensorsStore::from_file(&st).overwrite(true))
        .map_err(|e| e.to_string())?;
    eprintln!(
        "wrote the three inputs in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    Ok(checksum)
}

fn run_child(exe: &Path, arm: &str, args: &Args, dir: &Path) -> Result<Sample, String> {
    let t = Instant::now();
    let out = Command::new(exe)
        .args(["--arm", arm, "--dir"])
        .arg(dir)
        .args([
            "--layers",
            &args.layers.to_string(),
            "--dim",
            &args.dim.to_string(),
        ])
        .output()
        .map_err(|e| format!("spawning child: {e}"))?;
    let process_ms = ms(t);
    if !out.status.success() {
        return Err(format!(
            "child `{arm}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().ok_or("child printed nothing")?;
    let mut sample: Sample =
        serde_json::from_str(line).map_err(|e| format!("child output `{line}`: {e}"))?;
    sample.process_ms = process_ms;
    Ok(sample)
}

#[derive(Serialize)]
struct Stats {
    median: f64,
    min: f64,
    max: f64,
}

fn stats(mut v: Vec<f64>) -> Stats {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    Stats {
        median,
        min: v[0],
        max: v[n - 1],
    }
}

#[derive(Serialize)]
struct ArmSummary {
    arm: String,
    ready_ms: Stats,
    load_ms: Stats,
    forward_ms: Stats,
    process_ms: Stats,
    /// Per-round ready_ms / load_file's ready_ms in the same round.
    ratio_vs_load_file: Stats,
    rss_anon_after_load_mib: Stats,
    rss_file_after_load_mib: Stats,
    rss_anon_after_forward_mib: Stats,
    rss_file_after_forward_mib: Stats,
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("load_time: {e}");
            std::process::exit(2);
        }
    };
    let result = match &args.arm {
        Some(arm) => child(arm, &args),
        None => parent(&args),
    };
    if let Err(e) = result {
        eprintln!("load_time: {e}");
        std::process::exit(1);
    }
}

fn of<'a>(samples: &'a [Sample], arm: &'a str) -> impl Iterator<Item = &'a Sample> {
    samples.iter().filter(move |s| s.arm == arm)
}

fn parent(args: &Args) -> Result<(), String> {
    if args.rounds == 0 {
        return Err("--rounds must be at least 1".into());
    }
    let (dir, _guard) = match &args.dir {
        Some(d) => {
            std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
            (d.clone(), None)
        }
        None => {
            let t = tempfile::Builder::new()
                .prefix("burn-mapped-load-time")
                .tempdir_in("/tmp")
                .map_err(|e| e.to_string())?;
            (t.path().to_path_buf(), Some(t))
        }
    };
    let weights = (args.layers * args.dim * args.dim * 4) as u64;
    eprintln!(
        "{} layers of [{d}, {d}] f32: {:.2} GiB of weights in {}",
        args.layers,
        weights as f64 / (1u64 << 30) as f64,
        dir.display(),
        d = args.dim
    );
    let reference = write_inputs(args, &dir)?;
    let (mapped, bpk, st) = paths(&dir);
    let sizes = [
        size_of(&mapped).map_err(|e| e.to_string())?,
        size_of(&bpk).map_err(|e| e.to_string())?,
        size_of(&st).map_err(|e| e.to_string())?,
    ];
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut samples: Vec<Sample> = Vec::new();
    for round in 0..args.rounds {
        let mut order = ARMS.to_vec();
        if round % 2 == 1 {
            order.reverse();
        }
        for arm in order {
            let files = match arm {
                "mapped" => &mapped,
                "load_file" => &bpk,
                _ => &st,
            };
            warm(files).map_err(|e| format!("warming {}: {e}", files.display()))?;
            let mut sample = run_child(&exe, arm, args, &dir)?;
            sample.round = round;
            if (sample.checksum - reference).abs() > 1e-6 * reference.abs().max(1.0) {
                return Err(format!(
                    "arm {arm} computed {} but the saved model computes {reference}",
                    sample.checksum
                ));
            }
            eprintln!("round {round} {arm:<12} ready {:8.1} ms", sample.ready_ms);
            samples.push(sample);
        }
    }

    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let baseline: Vec<f64> = of(&samples, "load_file").map(|s| s.ready_ms).collect();
    let summaries: Vec<ArmSummary> = ARMS
        .iter()
        .map(|&arm| {
            let col = |f: &dyn Fn(&Sample) -> f64| stats(of(&samples, arm).map(f).collect());
            ArmSummary {
                arm: arm.to_string(),
                ready_ms: col(&|s| s.ready_ms),
                load_ms: col(&|s| s.load_ms),
                forward_ms: col(&|s| s.forward_ms),
                process_ms: col(&|s| s.process_ms),
                ratio_vs_load_file: stats(
                    of(&samples, arm)
                        .zip(&baseline)
                        .map(|(s, b)| s.ready_ms / b)
                        .collect(),
                ),
                rss_anon_after_load_mib: col(&|s| mib(s.rss_after_load.anon)),
                rss_file_after_load_mib: col(&|s| mib(s.rss_after_load.file)),
                rss_anon_after_forward_mib: col(&|s| mib(s.rss_after_forward.anon)),
                rss_file_after_forward_mib: col(&|s| mib(s.rss_after_forward.file)),
            }
        })
        .collect();

    println!(
        "{:<12} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9}",
        "arm", "ready ms", "min", "max", "vs bpk", "anon MiB", "file MiB", "anon fwd", "file fwd"
    );
    for s in &summaries {
        println!(
            "{:<12} {:>10.1} {:>10.1} {:>10.1} {:>10.3} {:>9.0} {:>9.0} {:>9.0} {:>9.0}",
            s.arm,
            s.ready_ms.median,
            s.ready_ms.min,
            s.ready_ms.max,
            s.ratio_vs_load_file.median,
            s.rss_anon_after_load_mib.median,
            s.rss_file_after_load_mib.median,
            s.rss_anon_after_forward_mib.median,
            s.rss_file_after_forward_mib.median,
        );
    }
    let report = serde_json::json!({
        "layers": args.layers,
        "dim": args.dim,
        "weight_bytes": weights,
        "file_bytes": {"mapped": sizes[0], "load_file": sizes[1], "safetensors": sizes[2]},
        "rounds": args.rounds,
        "page_cache": "warm (each arm's files read once right before its child starts)",
        "samples": samples,
        "summary": summaries,
    });
    let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
    println!("{text}");
    if let Some(path) = &args.json {
        std::fs::write(path, &text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}
