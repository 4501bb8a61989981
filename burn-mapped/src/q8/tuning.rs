//! How a product launches: the per-`T` defaults, and the explicit [`Tuning`] a benchmark or a
//! test passes instead, on a weight ([`Q8Weight::with_tuning`](super::Q8Weight::with_tuning))
//! or on a prepared input ([`Q8Input::with_tuning`](super::Q8Input::with_tuning)).
//!
//! Plain values with no kernel code, so host-only builds carry them too; the host kernel reads
//! only [`Tuning::host_threads`]. The measurements behind each default are in `docs/GPU.md`.

use super::error::Q8Error;

/// Activation rows per pass over the weights of the CubeCL kernels: the final reduction has
/// lane `j` of a row group write activation row `j` of the tile, so a group has at least
/// this many lanes.
pub(crate) const TILE: usize = 8;

/// The fewest activation rows that take [`DotTuning::MANY`] and the eight-row dp4a kernel
/// (`kernel_tile` in the kernel's module): one constant, so the shape and the kernel it is
/// tuned for cannot drift apart.
pub(crate) const MANY_FROM: usize = 5;

/// Explicit launch settings for q8 products, in place of the per-`T` defaults. Every field has
/// a default that means "what the product picks by itself", so `Tuning::default()` changes
/// nothing. For benchmarks and tests; a model never needs one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tuning {
    /// On a CubeCL device, the kernel and launch shape of every product, whatever its `T`
    /// (a dp4a shape applies where the kernel runs, `in % 16 == 0`; other widths keep the FMA
    /// defaults). `None`: per `T`, the dp4a kernel's default shape where `dp4a` is native
    /// (SPIR-V) and the row width fits, else the FMA kernel's ([`CubeTuning::default_for`]).
    pub cube: Option<CubeLaunch>,
    /// On the host, how many slabs the kernel splits a large matrix into; 0 means one per
    /// thread of the crate's pool (the machine's available parallelism, or the environment
    /// variable `BURN_MAPPED_THREADS`). The slabs run on that pool, so more slabs than threads
    /// queue rather than oversubscribe the cores.
    pub host_threads: usize,
}

impl Tuning {
    /// `Ok` if every shape is one the kernels run.
    ///
    /// # Errors
    ///
    /// [`Q8Error::Tuning`] naming the shape otherwise (see [`CubeTuning`] and [`DotTuning`]
    /// for the ranges).
    pub(crate) fn check(&self) -> Result<(), Q8Error> {
        let valid = match self.cube {
            None => true,
            Some(CubeLaunch::Fma(t)) => t.valid(),
            Some(CubeLaunch::Dot(t)) => t.valid(),
        };
        if valid {
            Ok(())
        } else {
            Err(Q8Error::Tuning {
                tuning: format!("{self:?}"),
            })
        }
    }
}

/// Which CubeCL kernel a product launches, and its shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CubeLaunch {
    /// The FMA kernel (every CubeCL device, every width that is a multiple of 4).
    Fma(CubeTuning),
    /// The dp4a kernel (every CubeCL device, native on SPIR-V; widths that are a multiple of
    /// 16).
    Dot(DotTuning),
}

/// Launch shape of the FMA kernel. Every field is a compile-time constant of the kernel, so
/// each distinct shape compiles (once) its own shader.
///
/// Valid shapes have at least 8 lanes (one per activation row of a tile), at most 256 threads per cube
/// (`lanes * groups`), `rows` and `unroll` in 1..=16 and `vector` 1, 2 or 4.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CubeTuning {
    /// Threads that share one output row (they stride along it together).
    pub lanes: usize,
    /// Row groups per cube.
    pub groups: usize,
    /// Output rows per thread (independent loads in flight per step).
    pub rows: usize,
    /// Strides along the row loaded before any arithmetic (more loads in flight).
    pub unroll: usize,
    /// Words per weight load (1, 2 or 4); rows whose length does not divide into such
    /// loads use the widest that does.
    pub vector: usize,
}

impl CubeTuning {
    /// One or two activation rows, where the weights' bytes bound the kernel: 4-word loads
    /// and four rows per thread keep sixteen loads in flight per step, and the scattered
    /// activation loads that wide loads cause cost nothing next to the weights' (the fastest
    /// T = 1 shape of the sweep in `docs/GPU.md`).
    pub const DEFAULT: CubeTuning = CubeTuning {
        lanes: 32,
        groups: 4,
        rows: 4,
        unroll: 4,
        vector: 4,
    };

    /// Three or more activation rows, where arithmetic and activation loads bound the kernel:
    /// eight output rows per thread reuse each loaded activation twice as often as
    /// [`Self::DEFAULT`], and 2-word loads keep a warp's activation loads half as scattered.
    /// More rows per thread gained little and compiled several times longer.
    pub const WIDE: CubeTuning = CubeTuning {
        lanes: 32,
        groups: 4,
        rows: 8,
        unroll: 2,
        vector: 2,
    };

    /// The shape a product with `tile` activation rows per pass launches with where it takes
    /// the FMA kernel and no [`Tuning`] says otherwise: the kernel is bound by memory at one
    /// or two rows and by arithmetic and activation loads from three on.
    pub const fn default_for(tile: usize) -> CubeTuning {
        match tile {
            0..=2 => CubeTuning::DEFAULT,
            _ => CubeTuning::WIDE,
        }
    }

    pub(crate) fn valid(&self) -> bool {
        layout_valid(self.lanes, self.groups, self.rows, self.unroll)
            && matches!(self.vector, 1 | 2 | 4)
    }
}

/// Launch shape of the dp4a kernel: the FMA kernel's layout ([`CubeTuning`]) with 16-byte
/// weight loads; every field is a compile-time constant.
///
/// Valid shapes have at least 8 lanes (one per activation row of a tile), at most 256 threads per cube and `rows` and
/// `unroll` in 1..=16.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DotTuning {
    /// Threads that share one output row, striding along it together.
    pub lanes: usize,
    /// Row groups per cube.
    pub groups: usize,
    /// Output rows per thread.
    pub rows: usize,
    /// Strides along the row loaded before any arithmetic.
    pub unroll: usize,
}

impl DotTuning {
    /// One activation row, where the weights' bytes bound the kernel: four strides of two
    /// rows in flight per thread keep eight 16-byte loads outstanding.
    pub const ONE: DotTuning = DotTuning {
        lanes: 32,
        groups: 4,
        rows: 2,
        unroll: 4,
    };

    /// Two to four activation rows: two rows per thread over 64 lanes (two planes per row)
    /// balance activation reuse against registers; three rows take it by interpolation.
    pub const FEW: DotTuning = DotTuning {
        lanes: 64,
        groups: 4,
        rows: 2,
        unroll: 2,
    };

    /// Five to eight activation rows: six output rows per thread reuse each
    /// activation load six times, and one stride in flight leaves the registers for them
    /// (eight rows per thread, the other candidate, ran slower).
    pub const MANY: DotTuning = DotTuning {
        lanes: 32,
        groups: 4,
        rows: 6,
        unroll: 1,
    };

    /// The shape a product with `tile` activation rows per pass takes where the kernel runs
    /// and no [`Tuning`] gives one.
    pub const fn default_for(tile: usize) -> DotTuning {
        match tile {
            0..=1 => DotTuning::ONE,
            2..MANY_FROM => DotTuning::FEW,
            _ => DotTuning::MANY,
        }
    }

    pub(crate) fn valid(&self) -> bool {
        layout_valid(self.lanes, self.groups, self.rows, self.unroll)
    }
}

/// The layout both kernels share: at least a tile's lanes per row (the final reduction has
/// lane `j` write activation row `j`), at most 256 threads per cube, and 1 to 16 rows per
/// thread and strides in flight (both unrolled at compile time).
fn layout_valid(lanes: usize, groups: usize, rows: usize, unroll: usize) -> bool {
    let small = |v: usize| (1..=16).contains(&v);
    lanes >= TILE && groups >= 1 && lanes * groups <= 256 && small(rows) && small(unroll)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_default_shape_is_one_the_kernels_run() {
        for tile in 0..=TILE + 1 {
            assert!(CubeTuning::default_for(tile).valid(), "tile {tile}");
            assert!(DotTuning::default_for(tile).valid(), "tile {tile}");
        }
        assert!(Tuning::default().check().is_ok());
    }

    #[test]
    fn rejects_shapes_the_kernels_cannot_run() {
        let fma = |t: CubeTuning| Tuning {
            cube: Some(CubeLaunch::Fma(t)),
            ..Tuning::default()
        };
        let dot = |t: DotTuning| Tuning {
            cube: Some(CubeLaunch::Dot(t)),
            ..Tuning::default()
        };
        let c = CubeTuning::DEFAULT;
        let bad_fma = [
            CubeTuning { lanes: 4, ..c },
            CubeTuning {
                lanes: 64,
                groups: 8,
                ..c
            },
            CubeTuning { unroll: 0, ..c },
            CubeTuning { rows: 17, ..c },
            CubeTuning { vector: 3, ..c },
        ]
        .map(fma);
        let d = DotTuning::MANY;
        let bad_dot = [
            DotTuning { lanes: 4, ..d },
            DotTuning { groups: 16, ..d },
            DotTuning { rows: 17, ..d },
            DotTuning { unroll: 0, ..d },
        ]
        .map(dot);
        for bad in bad_fma.into_iter().chain(bad_dot) {
            assert!(
                matches!(bad.check(), Err(Q8Error::Tuning { .. })),
                "{bad:?}"
            );
        }
        assert!(
            fma(CubeTuning {
                lanes: 16,
                ..CubeTuning::DEFAULT
            })
            .check()
            .is_ok()
        );
        assert!(dot(DotTuning { rows: 2, ..d }).check().is_ok());
    }
}
