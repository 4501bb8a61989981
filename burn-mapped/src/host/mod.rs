//! The host the store runs on: its page sizes, its memory as the kernel counts it, the worker
//! threads the CPU kernels and converters use, and which of those kernels run.

mod cpu;
pub mod memstat;

pub use cpu::{CPU_VAR, CpuTier, CpuTierError, cpu_tier, cpu_tier_from_env};

pub use crate::layout::{huge_page_size, page_size};
pub use crate::pool::{
    MAX_THREADS, THREADS_VAR, ThreadsVarError, for_each_piece, threads, threads_from_env,
};
