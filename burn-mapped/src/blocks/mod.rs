//! Products over quantized GGUF blocks kept exactly as the checkpoint holds them.
//!
//! A store converted with blocks kept ([`crate::convert::ConvertOptions::blocks`]) holds each
//! selected matrix as a `u8` tensor `[out, row_bytes]` with a [`BlockLayout`] in the manifest:
//! every row is `in / block_size` whole blocks of Q8_0, Q5_0, Q4_K or Q6_K, byte for byte as
//! in the GGUF. No dequantize/requantize step, so no second rounding, and the bytes a token
//! reads are the checkpoint's own.
//!
//! [`block_linear`]`(x, &weight, bias)` computes `y = x W^T + bias` on the host (Flex),
//! reading the blocks in place (for a store, the mapped pages). The activations are quantized
//! once per input to 8 bits with a scale per 32 values ([`BlockInput`], shared by the products
//! over the same rows); the dot products are integer within a block. The inner loop is chosen
//! at run time: AVX-512 VNNI (with F, BW and VL), AVX2 (with FMA and F16C), or portable Rust.

mod act;
mod error;
mod kernel;
mod weight;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use crate::gguf::BlockLayout;
pub use error::BlockError;
pub use weight::{
    BlockInput, BlockWeight, block_linear, block_linear_input, block_linear_into,
    block_linear_shared,
};

/// The inner loop this machine runs (for benchmark reports).
pub fn cpu_kernel_name() -> &'static str {
    kernel::Isa::detect().name()
}

#[cfg(test)]
mod tests;
