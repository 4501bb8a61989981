//! Output rows split into slabs on the crate's thread pool ([`crate::pool`]): the threading
//! both host kernels (q8 and GGUF blocks) share. A matrix smaller than one worker's worth of
//! bytes stays on the calling thread.

use crate::pool::{self, SharedMut, TASKS_PER_THREAD};

/// How a product's `out` rows are cut.
pub(crate) struct Slabs {
    /// Bytes of weights per output row.
    pub row_bytes: usize,
    /// Smallest slab of weight bytes worth a task of its own.
    pub min_bytes: usize,
    /// Most slabs (0: [`TASKS_PER_THREAD`] per thread of the pool, [`pool::threads`]).
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
        self.run_rows_into(out, t, &mut yt, fill);
        yt
    }

    /// As [`run_rows`](Self::run_rows), into the caller's `[out, t]` buffer `dst` (no
    /// allocation).
    pub(crate) fn run_rows_into(
        &self,
        out: usize,
        t: usize,
        dst: &mut [f32],
        fill: impl Fn(usize, usize, &mut [f32]) + Sync,
    ) {
        assert_eq!(dst.len(), out * t, "slabs: destination length");
        if t == 0 || out == 0 {
            return;
        }
        let (rows_per_slab, slabs) = self.cut(out);
        if slabs == 1 {
            fill(0, out, dst);
            return;
        }
        let base = SharedMut::new(dst);
        pool::run(slabs, &|i| {
            let start = i * rows_per_slab;
            let rows = rows_per_slab.min(out - start);
            // SAFETY: slab `i` is rows `start..start + rows` of `dst`, elements
            // `start * t..(start + rows) * t`, inside `dst` (`start + rows <= out` and
            // `dst.len() == out * t`) and disjoint from every other slab's. `pool::run` calls
            // each index once and returns only after every call has ended, while `dst` stays
            // mutably borrowed by this function, so this is the only reference to the piece
            // for as long as it lives.
            let piece = unsafe { base.piece(start * t, rows * t) };
            fill(start, rows, piece);
        });
    }
}

impl Slabs {
    /// Rows per slab and slabs for `out` rows (`out > 0`).
    fn cut(&self, out: usize) -> (usize, usize) {
        let requested = match self.threads {
            0 => pool::threads() * TASKS_PER_THREAD,
            n => n,
        };
        let multiple = self.row_multiple.max(1);
        let by_work = (out * self.row_bytes)
            .div_ceil(self.min_bytes.max(1))
            .max(1);
        let threads = requested.clamp(1, by_work).min(out.div_ceil(multiple));
        let rows_per_slab = out.div_ceil(threads).next_multiple_of(multiple);
        (rows_per_slab, out.div_ceil(rows_per_slab))
    }

    /// Runs `f(start, rows)` for the slabs of `out` rows, on the pool, for a caller that
    /// writes each slab's output itself.
    pub(crate) fn each(&self, out: usize, f: impl Fn(usize, usize) + Sync) {
        if out == 0 {
            return;
        }
        let (rows_per_slab, slabs) = self.cut(out);
        pool::run(slabs, &|i| {
            let start = i * rows_per_slab;
            f(start, rows_per_slab.min(out - start));
        });
    }
}

/// `[out, t]` row-major as `[t, out]`.
pub(crate) fn transpose(yt: &[f32], out: usize, t: usize) -> Vec<f32> {
    let mut y = vec![f32::NAN; t * out];
    transpose_into(yt, out, t, &mut y);
    y
}

/// `[out, t]` row-major written into `y` as `[t, out]`: in blocks of rows, so that reads walk
/// a few dozen rows of `yt` side by side, and for a prompt's sizes on the pool's threads.
pub(crate) fn transpose_into(yt: &[f32], out: usize, t: usize, y: &mut [f32]) {
    /// Rows of `yt` one pass reads side by side.
    const BLOCK: usize = 32;
    /// Elements below which the transpose stays on the calling thread.
    const PARALLEL: usize = 1 << 16;
    assert_eq!(y.len(), t * out, "transpose: output length");
    assert_eq!(yt.len(), t * out, "transpose: input length");
    if t == 1 {
        y.copy_from_slice(yt);
        return;
    }
    pool::for_each_piece(y, out, t * out >= PARALLEL, &|first, piece| {
        let rows = piece.len() / out;
        for o0 in (0..out).step_by(BLOCK) {
            let o1 = (o0 + BLOCK).min(out);
            for r in 0..rows {
                let dst = &mut piece[r * out + o0..r * out + o1];
                for (k, d) in dst.iter_mut().enumerate() {
                    *d = yt[(o0 + k) * t + first + r];
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element is written once, by the slab that holds its row, whatever the cut.
    #[test]
    fn slabs_cover_every_row_once() {
        for (out, t, threads, multiple) in
            [(1, 1, 4, 1), (37, 3, 5, 1), (37, 2, 4, 8), (100, 1, 64, 1)]
        {
            let slabs = Slabs {
                row_bytes: 1,
                min_bytes: 1,
                threads,
                row_multiple: multiple,
            };
            let mut dst = vec![f32::NAN; out * t];
            slabs.run_rows_into(out, t, &mut dst, |start, rows, piece| {
                assert_eq!(piece.len(), rows * t);
                assert!(start.is_multiple_of(multiple), "slab at {start}");
                for (k, v) in piece.iter_mut().enumerate() {
                    assert!(v.is_nan(), "written twice");
                    *v = (start * t + k) as f32;
                }
            });
            let want: Vec<f32> = (0..out * t).map(|i| i as f32).collect();
            assert_eq!(dst, want, "[{out}, {t}] in {threads} slabs of {multiple}");
            let y = slabs.run(out, t, |start, rows, piece| {
                for (k, v) in piece.iter_mut().enumerate() {
                    *v = ((start + k / t) * 1000 + k % t) as f32;
                }
                assert_eq!(piece.len(), rows * t);
            });
            for tt in 0..t {
                for o in 0..out {
                    assert_eq!(y[tt * out + o], (o * 1000 + tt) as f32);
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "destination length")]
    fn a_destination_of_the_wrong_length_is_refused() {
        let slabs = Slabs {
            row_bytes: 1,
            min_bytes: 1,
            threads: 2,
            row_multiple: 1,
        };
        slabs.run_rows_into(4, 2, &mut [0.0; 7], |_, _, _| {});
    }
}
