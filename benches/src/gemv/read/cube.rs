//! The read on a GPU (CubeCL): one kernel XORs vectors of words with `unroll` loads in flight
//! per thread and reduces per cube through shared memory.

use burn::tensor::{DType, Shape};
use burn_cubecl::CubeBackend;
use burn_cubecl::cubecl;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::{READ_PARTIALS, ReadBackend};

/// Threads per cube (the tree below is written for 256).
const READ_THREADS: usize = 256;

/// XOR of all words; one result per cube, reduced through shared memory.
#[cube(launch_unchecked)]
fn read_kernel<N: Size>(
    w: &[Vector<u32, N>],
    partial: &mut [u32],
    len: usize,
    #[comptime] unroll: usize,
) {
    let mut acc = Vector::<u32, N>::new(0u32);
    let stride = CUBE_COUNT_X as usize * READ_THREADS;
    let mut i = CUBE_POS_X as usize * READ_THREADS + UNIT_POS_X as usize;
    // `unroll` independent loads per step, then the strides left over one at a time.
    while i + (unroll - 1) * stride < len {
        let mut v = Array::<Vector<u32, N>>::new(unroll);
        #[unroll]
        for u in 0..unroll {
            v[u] = w[i + u * stride];
        }
        #[unroll]
        for u in 0..unroll {
            acc ^= v[u];
        }
        i += unroll * stride;
    }
    while i < len {
        acc ^= w[i];
        i += stride;
    }
    let mut x = 0u32;
    #[unroll]
    for v in 0..N::value() {
        x ^= acc.extract(v);
    }
    let u = UNIT_POS_X as usize;
    let mut shared = Shared::<[u32]>::new_slice(READ_THREADS);
    shared[u] = x;
    sync_cube();
    if u < 128 {
        shared[u] ^= shared[u + 128];
    }
    sync_cube();
    if u < 64 {
        shared[u] ^= shared[u + 64];
    }
    sync_cube();
    if u < 32 {
        shared[u] ^= shared[u + 32];
    }
    sync_cube();
    if u < 16 {
        shared[u] ^= shared[u + 16];
    }
    sync_cube();
    if u < 8 {
        shared[u] ^= shared[u + 8];
    }
    sync_cube();
    if u < 4 {
        shared[u] ^= shared[u + 4];
    }
    sync_cube();
    if u < 2 {
        shared[u] ^= shared[u + 2];
    }
    sync_cube();
    if u == 0 {
        partial[CUBE_POS_X as usize] = shared[0] ^ shared[1];
    }
}

impl ReadBackend for CubeBackend {
    fn gemv_read(values: CubeTensor, _threads: usize, unroll: usize) -> CubeTensor {
        assert_eq!(values.dtype, DType::I8, "gemv_read: values must be I8");
        assert!(
            (1..=16).contains(&unroll),
            "gemv_read: unroll {unroll} outside 1..=16"
        );
        let values = if values.is_contiguous() {
            values
        } else {
            into_contiguous(values)
        };
        let bytes = values.meta.shape().num_elements();
        assert_eq!(
            bytes % 4,
            0,
            "gemv_read: the GPU kernel needs `in` % 4 == 0"
        );
        let words = bytes / 4;
        let n = if words.is_multiple_of(4) { 4 } else { 1 };
        let client = values.client.clone();
        let out = if words == 0 {
            client.create_from_slice(u32::as_bytes(&[0u32; READ_PARTIALS]))
        } else {
            // Every cube writes its one partial, so the output needs no initial upload (an
            // upload is a queue write, which makes the stream submit the work recorded so
            // far).
            let out = client.empty(READ_PARTIALS * size_of::<u32>());
            // SAFETY: `values` holds `words / n` vectors of `n` u32 (the int8 bytes viewed
            // as words); `out` holds READ_PARTIALS u32, one per cube. Reads are bounded by
            // `len`.
            unsafe {
                read_kernel::launch_unchecked(
                    &client,
                    CubeCount::Static(READ_PARTIALS as u32, 1, 1),
                    CubeDim::new_1d(READ_THREADS as u32),
                    n,
                    BufferArg::from_raw_parts(values.handle.clone(), words / n),
                    BufferArg::from_raw_parts(out.clone(), READ_PARTIALS),
                    words / n,
                    unroll,
                );
            }
            out
        };
        CubeTensor::new_contiguous(
            client,
            values.device.clone(),
            Shape::new([READ_PARTIALS]),
            out,
            DType::U32,
        )
    }
}
