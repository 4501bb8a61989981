//! The read ceiling the q8 products are measured against: every byte of a weight's int8
//! values read once, XORed and nothing else, with the same threads (host) or on the same
//! stream (GPU) as the product. A Burn backend extension of the benchmark's own, on the
//! public APIs of Burn and CubeCL.

use burn::backend::tensor::IntTensor;
use burn::backend::{Backend, Dispatch, backend_extension};
use burn::tensor::{DType, Int, Shape, Tensor};
use burn_mapped::q8::Q8Weight;

/// Length of the checksum tensor [`read_weight`] returns.
pub const READ_PARTIALS: usize = 1024;

/// Smallest slab of bytes worth a task of its own on the host: the q8 host kernel's, so the
/// read splits the weight as the product does.
const MIN_BYTES_PER_THREAD: usize = 256 * 1024;

/// Output dtype of `gemv_read`, whatever the input's.
#[cfg_attr(not(feature = "fusion"), allow(dead_code))]
fn read_dtype(_values: DType) -> DType {
    DType::U32
}

/// Output shape of `gemv_read`, whatever the input's.
#[cfg_attr(not(feature = "fusion"), allow(dead_code))]
fn read_shape(_values: &Shape) -> Shape {
    Shape::new([READ_PARTIALS])
}

/// Backends that run the read.
#[backend_extension(Flex, Cube: cfg(feature = "wgpu"), Fusion: cfg(feature = "fusion"))]
pub trait ReadBackend: Backend {
    /// Reads every byte of `values` (I8) once and returns [`READ_PARTIALS`] XOR checksums
    /// (U32): on the host over `threads` slabs, on a GPU with `unroll` loads in flight per
    /// thread.
    #[fusion(dtype = read_dtype(values), shape = read_shape(values))]
    fn gemv_read(values: IntTensor<Self>, threads: usize, unroll: usize) -> IntTensor<Self>;
}

/// Reads every byte of the weight's int8 values once and returns `[READ_PARTIALS]` U32
/// partial checksums whose XOR is the XOR of the bytes as little-endian u32 words (the last
/// zero-padded). No arithmetic on the values: its rate is the read ceiling for the product.
/// `threads` is the host's slab count (as [`burn_mapped::q8::Tuning::host_threads`], 0 for
/// one per rayon worker), `unroll` the GPU's loads in flight per thread (1 to 16).
pub fn read_weight(w: &Q8Weight, threads: usize, unroll: usize) -> Tensor<1, Int> {
    let values = w.values().clone().into_dispatch();
    Tensor::from_dispatch(Dispatch::gemv_read(values, threads, unroll))
}

/// XOR of `bytes` as little-endian u32 words (the last one zero-padded), split over up to
/// `threads` threads (0: one per rayon worker), one result each, at most [`READ_PARTIALS`].
pub fn read_xor(bytes: &[u8], threads: usize) -> Vec<u32> {
    let threads = match threads {
        0 => rayon::current_num_threads(),
        n => n,
    };
    let by_work = bytes.len().div_ceil(MIN_BYTES_PER_THREAD).max(1);
    let threads = threads.clamp(1, by_work).min(READ_PARTIALS);
    let chunk = bytes.len().div_ceil(threads).next_multiple_of(64).max(64);
    let fold = |part: &[u8]| -> u32 {
        let mut acc = [0u64; 8];
        let mut blocks = part.chunks_exact(64);
        for block in &mut blocks {
            for (k, a) in acc.iter_mut().enumerate() {
                *a ^= u64::from_le_bytes(block[8 * k..8 * k + 8].try_into().expect("8 bytes"));
            }
        }
        let x = acc.iter().fold(0u64, |x, a| x ^ a);
        let mut x = (x ^ (x >> 32)) as u32;
        for word in blocks.remainder().chunks(4) {
            let mut w = [0u8; 4];
            w[..word.len()].copy_from_slice(word);
            x ^= u32::from_le_bytes(w);
        }
        x
    };
    let mut out = vec![0u32; bytes.len().div_ceil(chunk)];
    rayon::scope(|scope| {
        for (part, slot) in bytes.chunks(chunk).zip(out.iter_mut()) {
            scope.spawn(move |_| *slot = fold(part));
        }
    });
    out
}

mod flex;

#[cfg(feature = "wgpu")]
mod cube;

#[cfg(test)]
mod tests {
    use burn::tensor::{Device, f16};
    use burn_mapped::q8::{Q8Rows, Q8Weight};

    use super::*;

    /// XOR of `bytes` as little-endian u32 words, the last one zero-padded.
    fn xor_words(bytes: &[i8]) -> u32 {
        bytes.chunks(4).fold(0u32, |x, w| {
            let mut b = [0u8; 4];
            for (d, s) in b.iter_mut().zip(w) {
                *d = *s as u8;
            }
            x ^ u32::from_le_bytes(b)
        })
    }

    /// Checks every `(out, inp)` weight's partials against [`xor_words`] for each setting.
    fn reads_every_byte(device: &Device, shapes: &[(usize, usize)], settings: &[(usize, usize)]) {
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        for &(out, inp) in shapes {
            let values: Vec<i8> = (0..out * inp)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    (seed >> 56) as i8
                })
                .collect();
            let rows = Q8Rows {
                values: values.clone(),
                scales: vec![f16::ONE; out],
            };
            let w = Q8Weight::from_rows(&rows, out, inp, device).unwrap();
            for &(threads, unroll) in settings {
                let partials: Vec<u32> = read_weight(&w, threads, unroll)
                    .into_data()
                    .try_to_vec()
                    .unwrap();
                assert_eq!(partials.len(), READ_PARTIALS);
                let x = partials.iter().fold(0, |x, p| x ^ p);
                assert_eq!(
                    x,
                    xor_words(&values),
                    "[{out}, {inp}] threads {threads} unroll {unroll}"
                );
            }
        }
    }

    /// Odd lengths (a zero-padded last word) and slabs over several threads.
    #[test]
    fn the_host_read_reads_every_byte() {
        reads_every_byte(
            &Device::flex(),
            &[(37, 53), (700, 1001), (1, 3)],
            &[(0, 1), (1, 1), (3, 1)],
        );
    }

    /// Word counts with and without a multiple of 4 (vec4 or scalar loads), one far larger
    /// than the kernel's 1024 x 256 threads (grid-stride loop), unrolls that leave remainders.
    /// Skips without an adapter.
    #[cfg(feature = "wgpu")]
    #[test]
    fn the_gpu_read_reads_every_word() {
        use burn::tensor::DeviceType;
        let Some(device) = Device::enumerate(DeviceType::Wgpu)
            .into_vec()
            .into_iter()
            .next()
        else {
            eprintln!("no wgpu adapter: skipping");
            return;
        };
        reads_every_byte(
            &device,
            &[(37, 52), (40, 64), (1100, 1028)],
            &[(0, 1), (0, 3), (0, 4), (0, 7)],
        );
    }
}
