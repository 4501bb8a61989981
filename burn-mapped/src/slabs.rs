//! Output rows split into slabs on rayon's global pool: the threading both host kernels (q8
//! and GGUF blocks) share. Workers persist (a decode step issues ~170 products, and spawning
//! threads for each would cost more than the small ones take); a matrix smaller than one
//! worker's worth of bytes stays on the calling thread.

/// How a product's `out` rows are cut.
pub(crate) struct Slabs {
    /// Bytes of weights per output row.
    pub row_bytes: usize,
    /// Smallest slab of weight bytes worth a task of its own.
    pub min_bytes: usize,
    /// Most slabs (0: one per worker of rayon's global pool).
    pub threads: usize,
    /// Slabs hold a multiple of this many rows (but the last), so kernels that take rows in
    /// blocks run full blocks.
    pub row_multiple: usize,
}

impl Slabs {
    /// Runs `fill(start, rows, dst)` over slabs of `out` rows, `dst` being the slab's
    /// `[rows, t]` piece of a row-major `[out, t]` buffer, and returns the result transposed to
    /// `[t, out]`. Elements start as NaN, so one a kernel failed to write shows in any
    /// comparison.
    pub(crate) fn run(
        &self,
        out: usize,
        t: usize,
        fill: impl Fn(usize, usize, &mut [f32]) + Sync,
    ) -> Vec<f32> {
        let yt = self.run_rows(out, t, fill);
        transpose(&yt, out, t)
    }

    /// As [`run`](Self::run), returning the `[out, t]` buffer as the slabs filled it.
    pub(crate) fn run_rows(
        &self,
        out: usize,
        t: usize,
        fill: impl Fn(usize, usize, &mut [f32]) + Sync,
    ) -> Vec<f32> {
        let mut yt = vec![f32::NAN; out * t];
        if t == 0 || out == 0 {
            return yt;
        }
        let requested = match self.threads {
            0 => rayon::current_num_threads(),
            n => n,
        };
        let multiple = self.row_multiple.max(1);
        let by_work = (out * self.row_bytes)
            .div_ceil(self.min_bytes.max(1))
            .max(1);
        let threads = requested.clamp(1, by_work).min(out.div_ceil(multiple));
        let rows_per_slab = out.div_ceil(threads).next_multiple_of(multiple);
        let fill = &fill;
        rayon::scope(|scope| {
            let mut rest = yt.as_mut_slice();
            let mut row = 0;
            while row < out {
                let rows = rows_per_slab.min(out - row);
                let (mine, tail) = rest.split_at_mut(rows * t);
                rest = tail;
                let start = row;
                if row + rows == out {
                    fill(start, rows, mine); // the calling thread takes the last slab
                } else {
                    scope.spawn(move |_| fill(start, rows, mine));
                }
                row += rows;
            }
        });
        yt
    }
}

/// `[out, t]` row-major as `[t, out]`.
pub(crate) fn transpose(yt: &[f32], out: usize, t: usize) -> Vec<f32> {
    if t == 1 {
        return yt.to_vec();
    }
    let mut y = vec![f32::NAN; t * out];
    for o in 0..out {
        for tt in 0..t {
            y[tt * out + o] = yt[o * t + tt];
        }
    }
    y
}
