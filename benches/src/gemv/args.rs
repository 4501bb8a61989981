//! The command line of `gemv`.

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::Parser;

/// GEMV benchmark under the paper's matched protocol (§3.1), on Burn's own stream.
///
/// One pass = one product over each of `--matrices` distinct `[out, in]` int8 matrices
/// (default 12 x 12288 x 7168, 88.1 MB each, stored as a burn-mapped store and adopted from
/// the page cache on Flex) followed by one device sync. `--warmup` passes (12, at least one),
/// and more until `--warmup-ms` (200) have passed since the first (which compiles), are
/// discarded (a GPU drops its clock while the host compiles a shader, and compute-bound arms
/// measured before it climbs back ran up to 3x slow on the H200), then `--passes` (30) are
/// timed one by one; the report gives the median and the min/max. GB/s counts each arm's
/// weight bytes once per pass (int8 values + f16 scales for q8, 4 or 2 bytes per weight for
/// the float arms).
///
/// Arms, all in one run: `read` (every weight byte read once, XOR, same threads or stream:
/// the ceiling), `q8` at every `T` of `--t-sweep` (1,2,4,8), Burn's float matmul `f32`
/// (and `f16` where the device supports it) at `T = 1` on the dequantized weights, computed
/// as `nn::Linear` with `LinearLayout::Col` computes it (`x @ W^T`, `W` stored `[out, in]`),
/// and `burnq8`: the same weights through Burn's own int8 quantization (default scheme) and
/// matmul at `T = 1` (bytes: one int8 per weight).
///
/// Diagnostics beyond the protocol: arm `sync` times one sync with nothing queued (the floor
/// under every pass); `--per-sync 1,10` adds read and q8 arms that queue several passes per
/// sync (times per pass), which separates a fixed per-sync cost from the kernels' own; every
/// arm also reports the host time spent enqueueing; `--flush-first` submits each pass (Burn's
/// `Device::flush`) before its sync and reports that submission's host time apart, so a pass
/// splits into enqueue, submission and the wait for the device's answer. `--device-time`
/// (CubeCL devices) times each arm's passes again, each inside one of Burn's profiling
/// windows, and reports the device's own clock per pass beside the wall time: what the GPU
/// spent from its first kernel to its last, without the host's encoding before submission or
/// the wait for the sync's answer. Arms `q8shared` and `q8sharedgraph` are `q8` and `q8graph`
/// with the pass's products on one `Q8Input` (one activation split for all, where the dp4a
/// kernel runs; elsewhere the same as `q8`). Arms `readgraph` and `q8graph` (CubeCL devices)
/// capture one pass with Burn's graph capture and time replays of it (each + one sync),
/// `q8graph` at every `T` of `--t-sweep` and every shape of `--tunings` (replays keep the GPU
/// busy, so its clock stays up; eager arms let it idle). Each GPU arm reports the kernel and
/// shape it ran.
///
/// The wgpu device (WGSL, or SPIR-V where wgpu settles on Vulkan and `vulkan` is built in)
/// needs `--features wgpu`; the vulkan device (Burn's `vulkan` backend: wgpu pinned to
/// Vulkan, SPIR-V) needs `--features vulkan`. GPU weights are uploaded once and stay resident.
#[derive(Debug, Clone, Parser)]
#[command(name = "gemv", verbatim_doc_comment)]
pub struct Args {
    /// flex, wgpu (`--features wgpu`) or vulkan (`--features vulkan`).
    #[arg(long, default_value = "flex")]
    pub device: String,
    /// Distinct matrices per pass.
    #[arg(long, default_value_t = 12)]
    pub matrices: usize,
    /// Matrices of the float and `burnq8` arms (default and at most: `--matrices`).
    #[arg(long)]
    pub float_matrices: Option<usize>,
    /// Output rows per matrix.
    #[arg(long, default_value_t = 12288)]
    pub out: usize,
    /// Input columns per matrix.
    #[arg(long = "in", default_value_t = 7168)]
    pub inp: usize,
    /// Timed passes per arm.
    #[arg(long, default_value_t = 30)]
    pub passes: usize,
    /// Discarded passes per arm (at least one).
    #[arg(long, default_value_t = 12)]
    pub warmup: usize,
    /// Least time the discarded passes take after the first, in milliseconds.
    #[arg(long, default_value_t = 200)]
    pub warmup_ms: usize,
    /// Activation rows of the q8 arms.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 2, 4, 8])]
    pub t_sweep: Vec<usize>,
    /// Arms to run: read, q8, q8shared, q8graph, q8sharedgraph, readgraph, f32, f16, burnq8,
    /// sync.
    #[arg(long, value_delimiter = ',', default_values_t = ["read", "q8", "f32", "f16", "burnq8"].map(String::from))]
    pub arms: Vec<String>,
    /// Host slabs per matrix (0: the kernels' default, a few per worker of burn-mapped's pool).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// The store of random q8 matrices (a cache; default under `~/.cache/burn-mapped/gemv/`).
    #[arg(long)]
    pub store: Option<PathBuf>,
    /// Writes the JSON report here instead of standard output.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Passes queued per sync; each count gets its own read and q8 arms.
    #[arg(long, value_delimiter = ',', default_values_t = [1])]
    pub per_sync: Vec<usize>,
    /// CubeCL devices: measures the read and q8 arms once per kernel launch shape:
    /// `lanes.groups.rows.unroll.read_unroll[.vector]` for the FMA kernel at every `T`,
    /// `dot.lanes.groups.rows.unroll` for the dp4a kernel at every `T`, `default` for the
    /// per-`T` defaults.
    #[arg(long, value_delimiter = ',')]
    pub tunings: Vec<String>,
    /// CubeCL devices: times each arm's passes again on the device's clock.
    #[arg(long)]
    pub device_time: bool,
    /// Submits each pass before its sync and reports the submission's host time apart.
    #[arg(long)]
    pub flush_first: bool,
}

impl Args {
    /// `Err` for counts that must be positive.
    pub fn checked(self) -> Result<Self> {
        if self.matrices == 0 || self.passes == 0 || self.out == 0 || self.inp == 0 {
            bail!("--matrices, --passes, --out and --in must be positive");
        }
        if self.t_sweep.contains(&0) {
            bail!("--t-sweep: T must be positive");
        }
        if self.per_sync.contains(&0) {
            bail!("--per-sync: counts must be positive");
        }
        Ok(self)
    }

    /// Matrices of the float arms: `--float-matrices`, at most `--matrices`.
    pub fn float_matrices(&self) -> usize {
        self.float_matrices
            .map_or(self.matrices, |n| n.min(self.matrices))
    }

    /// Whether `arm` is to run.
    pub fn runs(&self, arm: &str) -> bool {
        self.arms.iter().any(|s| s == arm)
    }
}
