//! `cuda_probe`: the map / resident / per-use-copy endpoints of a CUDA device over a store's
//! files, the Vulkan host-import capabilities of the same machine, and the rule's verdict, as
//! JSON that `burn-mapped select --from` reads. `libcuda` and `libvulkan` are loaded at run
//! time, so the binary runs (and says what is missing) on machines without them.
//!
//! `cuda_probe make-store DIR --bytes 4GiB` writes a synthetic store of pseudo-random files for
//! machines that cannot receive a real one.

use std::io::{BufWriter, Write};
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use serde::Serialize;

use burn_mapped_tools::cli::probe::render_report;
use burn_mapped_tools::cli::select::{parse_bytes, render_verdict};
use burn_mapped_tools::probe::cuda::{
    CudaCapabilities, CudaProbeConfig, RegistrationAttempt, probe_cuda,
};
use burn_mapped_tools::probe::tensor_files_in;
use burn_mapped_tools::probe::vulkan::{VulkanReport, probe_vulkan};
use burn_mapped_tools::select::{DEFAULT_THETA, Verdict, select};

#[derive(Parser)]
#[command(name = "cuda_probe", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Probe the three endpoints on a CUDA device and the Vulkan import capability.
    Probe(ProbeArgs),
    /// Write a synthetic store of pseudo-random tensor files.
    MakeStore(MakeStoreArgs),
}

#[derive(clap::Args)]
struct ProbeArgs {
    /// A store directory (every file but manifest.json is part of W) or single files.
    #[arg(required = true)]
    inputs: Vec<PathBuf>,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Measured passes per arm (the rate is the median).
    #[arg(long, default_value_t = 5)]
    passes: usize,
    /// Discarded warm-up passes per arm (at least 1).
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Per-use copy staging chunk (two pinned and two device buffers of this size).
    #[arg(long, default_value = "64MiB", value_parser = parse_bytes)]
    chunk: u64,
    /// Threads for the host staging copy and the reference checksum.
    #[arg(long)]
    threads: Option<NonZeroUsize>,
    /// The rule's tie band.
    #[arg(long, default_value_t = DEFAULT_THETA)]
    theta: f64,
    /// Skip the Vulkan capability probe.
    #[arg(long)]
    no_vulkan: bool,
    /// Write the JSON here instead of stdout.
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(clap::Args)]
struct MakeStoreArgs {
    /// Directory to create (must not exist).
    dir: PathBuf,
    /// Total bytes, split evenly over `--files` (each rounded up to 16 KiB).
    #[arg(long, value_parser = parse_bytes, required_unless_present = "sizes")]
    bytes: Option<u64>,
    /// Number of files for `--bytes`.
    #[arg(long, default_value_t = 64)]
    files: usize,
    /// A text file with one file size in bytes per line (e.g. a real store's tensor files).
    #[arg(long, conflicts_with = "bytes")]
    sizes: Option<PathBuf>,
    /// Writer threads.
    #[arg(long)]
    threads: Option<NonZeroUsize>,
}

#[derive(Serialize)]
struct Output<'a> {
    probe: &'a burn_mapped_tools::probe::ProbeReport,
    verdict: Option<Verdict>,
    verdict_error: Option<String>,
    cuda: &'a CudaCapabilities,
    cuda_unavailable: &'a Option<String>,
    vulkan: Option<VulkanReport>,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Probe(args) => probe(&args),
        Command::MakeStore(args) => make_store(&args),
    }
}

fn inputs(list: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for input in list {
        if input.is_dir() {
            files.extend(tensor_files_in(input)?);
        } else {
            files.push(input.clone());
        }
    }
    if files.is_empty() {
        bail!("no files to probe");
    }
    Ok(files)
}

fn probe(args: &ProbeArgs) -> anyhow::Result<()> {
    let files = inputs(&args.inputs)?;
    let mut config = CudaProbeConfig {
        device: args.device,
        warmup_passes: args.warmup,
        passes: args.passes,
        chunk_bytes: usize::try_from(args.chunk).context("--chunk")?,
        ..CudaProbeConfig::default()
    };
    if let Some(threads) = args.threads {
        config.threads = threads.get();
    }
    let result = probe_cuda(&files, &config)?;
    let vulkan = if args.no_vulkan {
        None
    } else {
        Some(probe_vulkan(&files)?)
    };
    let (verdict, verdict_error) = match select(&result.probe.select_input(), args.theta) {
        Ok(v) => (Some(v), None),
        Err(e) => (None, Some(e.to_string())),
    };

    eprint!("{}", render_report(&result.probe));
    if let Some(reason) = &result.cuda_unavailable {
        eprintln!("cuda unavailable: {reason}");
    }
    for RegistrationAttempt { flags, result } in &result.cuda.registration {
        eprintln!("  cuMemHostRegister {flags}: {result}");
    }
    if let Some(vk) = &vulkan {
        eprintln!("{}", vk.summary());
    }
    match (&verdict, &verdict_error) {
        (Some(v), _) => eprint!("{}", render_verdict(v)),
        (None, Some(e)) => eprintln!("no verdict: {e}"),
        (None, None) => {}
    }

    let output = Output {
        probe: &result.probe,
        verdict_error,
        cuda: &result.cuda,
        cuda_unavailable: &result.cuda_unavailable,
        vulkan,
        verdict,
    };
    let json = serde_json::to_string_pretty(&output)?;
    match &args.out {
        Some(path) => std::fs::write(path, json + "\n")
            .with_context(|| format!("writing {}", path.display()))?,
        None => println!("{json}"),
    }
    if output.verdict.is_none() {
        std::process::exit(2);
    }
    Ok(())
}

/// Granularity of synthetic file sizes, the store format's tensor padding.
const PAD: u64 = 16 << 10;

fn make_store(args: &MakeStoreArgs) -> anyhow::Result<()> {
    let sizes: Vec<u64> = match (&args.sizes, args.bytes) {
        (Some(path), _) => std::fs::read_to_string(path)
            .with_context(|| format!("reading {}", path.display()))?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                l.trim()
                    .parse::<u64>()
                    .with_context(|| format!("size `{l}`"))
            })
            .collect::<Result<_, _>>()?,
        (None, Some(total)) => {
            if args.files == 0 {
                bail!("--files must be at least 1");
            }
            let each = (total / args.files as u64).div_ceil(PAD) * PAD;
            vec![each; args.files]
        }
        (None, None) => bail!("give --bytes or --sizes"),
    };
    if args.dir.exists() {
        bail!("{} exists; give a new directory", args.dir.display());
    }
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("creating {}", args.dir.display()))?;
    let threads = args.threads.map_or_else(
        || std::thread::available_parallelism().map_or(1, |n| n.get()),
        |n| n.get(),
    );
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| -> anyhow::Result<()> {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(&len) = sizes.get(i) else {
                            return Ok(());
                        };
                        write_file(&args.dir.join(format!("{i:05}.tensor")), len, i as u64)?;
                    }
                })
            })
            .collect();
        for worker in workers {
            worker
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p))?;
        }
        Ok(())
    })?;
    let total: u64 = sizes.iter().sum();
    eprintln!(
        "wrote {} files, {total} bytes ({:.3} GiB), to {}",
        sizes.len(),
        total as f64 / f64::from(1u32 << 30),
        args.dir.display()
    );
    Ok(())
}

/// `len` pseudo-random bytes (xorshift64*, seeded per file).
fn write_file(path: &Path, len: u64, seed: u64) -> anyhow::Result<()> {
    let file =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut block = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        for word in block.chunks_exact_mut(8) {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            word.copy_from_slice(&state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
        }
        let n = usize::try_from(left.min(block.len() as u64)).unwrap_or(block.len());
        out.write_all(&block[..n])
            .with_context(|| format!("writing {}", path.display()))?;
        left -= n as u64;
    }
    out.flush()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
