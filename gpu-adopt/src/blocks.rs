//! A tensor larger than one storage binding, as blocks of its rows.
//!
//! A kernel binds each tensor it reads whole, and drivers cap a binding (lavapipe at 128 MiB),
//! so a vocabulary-sized matrix cannot be one tensor there, adopted or copied. Its file can
//! still be adopted: each block of rows is imported from its own sub-range of the one mapping
//! (starting on the driver's import granularity) and becomes a tensor of its own, which the
//! model then uses block by block.

use std::ops::Range;
use std::sync::Arc;

use burn::tensor::{DType, Int, Shape, Tensor, TensorData};
use burn_cubecl::tensor::CubeTensor;
use burn_mapped::{MappedFile, MappedStore};

use crate::device::{GpuDevice, Placed, entry, kind, lookup};
use crate::error::AdoptError;
use crate::primitive;

/// Where one block lies in its file, and its shape.
struct Part<const D: usize> {
    bytes: Range<usize>,
    shape: [usize; D],
}

/// One block, before it is typed as a float or integer tensor.
enum Block {
    Adopted(Box<CubeTensor>),
    Copied(TensorData),
}

impl GpuDevice {
    /// The most rows per block such that every block of each named tensor (split along its
    /// first dimension) fits a storage binding and, where the device imports host memory,
    /// starts on the import granularity. One count serves tensors split alike, such as a q8
    /// matrix's values and its row scales. With no names, any count fits: `usize::MAX`.
    ///
    /// When no count both fits and aligns, the largest fitting one is returned; blocks that
    /// do not start on the granularity then load resident (with the reason).
    ///
    /// # Errors
    ///
    /// [`AdoptError::Blocks`] when a single row exceeds a binding or a tensor has no rows;
    /// store errors for unknown names.
    pub fn block_rows(&self, store: &MappedStore, names: &[&str]) -> Result<usize, AdoptError> {
        let align = self.import_alignment().unwrap_or(1);
        let limit = self.max_binding();
        let (mut step, mut most) = (1u64, u64::MAX);
        for &name in names {
            let (rows, row_bytes) = row_layout(store, name)?;
            if row_bytes > limit {
                return Err(blocks_error(
                    name,
                    rows,
                    row_bytes,
                    1,
                    "one row exceeds the device's largest storage binding",
                ));
            }
            most = most.min(limit / row_bytes);
            step = lcm(step, align / gcd(row_bytes, align));
        }
        let rows = if most >= step {
            most / step * step
        } else {
            most
        };
        Ok(usize::try_from(rows).unwrap_or(usize::MAX))
    }

    /// Tensor `name` of `store` as blocks of `rows` rows along its first dimension (the last
    /// block holds the rest), in order: each adopted from its part of the file's mapping when
    /// `adopt` is true and the device imports it, else copied into device memory (with the
    /// reason).
    ///
    /// # Errors
    ///
    /// [`AdoptError::Blocks`] for a zero `rows` or a block larger than a binding; otherwise as
    /// [`load_float`](Self::load_float).
    pub fn load_float_rows<const D: usize>(
        &self,
        store: &MappedStore,
        name: &str,
        rows: usize,
        adopt: bool,
    ) -> Result<Vec<(Tensor<D>, Placed)>, AdoptError> {
        let blocks = self.blocks::<D>(store, name, rows, adopt, true)?;
        Ok(typed(blocks, |block| match block {
            Block::Adopted(cube) => {
                Tensor::from_primitive::<burn_cubecl::Cube>(primitive::float(*cube))
            }
            Block::Copied(data) => {
                let dtype = data.dtype();
                Tensor::from_data(data, (self.device(), dtype))
            }
        }))
    }

    /// As [`load_float_rows`](Self::load_float_rows), for an integer tensor.
    ///
    /// # Errors
    ///
    /// As [`load_float_rows`](Self::load_float_rows).
    pub fn load_int_rows<const D: usize>(
        &self,
        store: &MappedStore,
        name: &str,
        rows: usize,
        adopt: bool,
    ) -> Result<Vec<(Tensor<D, Int>, Placed)>, AdoptError> {
        let blocks = self.blocks::<D>(store, name, rows, adopt, false)?;
        Ok(typed(blocks, |block| match block {
            Block::Adopted(cube) => {
                Tensor::from_primitive::<burn_cubecl::Cube>(primitive::int(*cube))
            }
            Block::Copied(data) => {
                let dtype = data.dtype();
                Tensor::from_data(data, (self.device(), dtype))
            }
        }))
    }

    fn blocks<const D: usize>(
        &self,
        store: &MappedStore,
        name: &str,
        rows: usize,
        adopt: bool,
        float: bool,
    ) -> Result<Vec<(Block, Placed)>, AdoptError> {
        let (file, shape, dtype) = lookup::<D>(store, name)?;
        kind(name, dtype, float)?;
        let parts = self.parts(name, shape, dtype, rows)?;
        let mut out = Vec::with_capacity(parts.len());
        for Part {
            bytes,
            shape: block_shape,
        } in parts
        {
            let adopted = adopt
                .then(|| self.cube_tensor(file, bytes.clone(), Shape::new(block_shape), dtype));
            out.push(match adopted {
                Some(Ok(cube)) => (Block::Adopted(Box::new(cube)), Placed::MAPPED),
                Some(Err(e)) if e.resident_fallback() => (
                    copy(file, bytes, block_shape, dtype),
                    Placed::refused(self.fallback_reason(&e)),
                ),
                Some(Err(e)) => return Err(e),
                None => (copy(file, bytes, block_shape, dtype), Placed::RESIDENT),
            });
        }
        Ok(out)
    }

    /// Byte range and shape of each block of `rows` rows.
    fn parts<const D: usize>(
        &self,
        name: &str,
        shape: [usize; D],
        dtype: DType,
        rows: usize,
    ) -> Result<Vec<Part<D>>, AdoptError> {
        let (total, row_bytes) = rows_of(name, &shape, dtype, rows)?;
        let fail = |reason| blocks_error(name, total, row_bytes, rows, reason);
        let row_bytes = row_bytes as usize;
        if rows == 0 {
            return Err(fail("a block needs at least one row"));
        }
        let block_bytes = rows.min(total) as u64 * row_bytes as u64;
        if block_bytes > self.max_binding() {
            return Err(fail("a block exceeds the device's largest storage binding"));
        }
        Ok((0..total)
            .step_by(rows)
            .map(|first| {
                let n = rows.min(total - first);
                let mut block = shape;
                block[0] = n;
                Part {
                    bytes: first * row_bytes..(first + n) * row_bytes,
                    shape: block,
                }
            })
            .collect())
    }
}

fn typed<T>(blocks: Vec<(Block, Placed)>, make: impl Fn(Block) -> T) -> Vec<(T, Placed)> {
    blocks
        .into_iter()
        .map(|(block, placement)| (make(block), placement))
        .collect()
}

fn copy<const D: usize>(
    file: &Arc<MappedFile>,
    bytes: Range<usize>,
    shape: [usize; D],
    dtype: DType,
) -> Block {
    Block::Copied(TensorData::from_bytes_vec(
        file.bytes()[bytes].to_vec(),
        shape.to_vec(),
        dtype,
    ))
}

/// Rows (first dimension) and bytes per row of tensor `name`.
fn row_layout(store: &MappedStore, name: &str) -> Result<(usize, u64), AdoptError> {
    let entry = entry(store, name)?;
    rows_of(name, entry.shape(), entry.dtype(), 0)
}

/// Rows and bytes per row of a tensor of `shape`; `block` is the block size asked for, for the
/// error when there are no rows.
fn rows_of(
    name: &str,
    shape: &[usize],
    dtype: DType,
    block: usize,
) -> Result<(usize, u64), AdoptError> {
    let rows = shape.first().copied().unwrap_or(0);
    let row_bytes = shape.iter().skip(1).product::<usize>() as u64 * dtype.size() as u64;
    if rows == 0 || row_bytes == 0 {
        return Err(blocks_error(
            name,
            rows,
            row_bytes,
            block,
            "the tensor has no rows",
        ));
    }
    Ok((rows, row_bytes))
}

fn blocks_error(
    tensor: &str,
    rows: usize,
    row_bytes: u64,
    block: usize,
    reason: &'static str,
) -> AdoptError {
    AdoptError::Blocks {
        tensor: tensor.to_string(),
        rows,
        row_bytes,
        block,
        reason,
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn lcm(a: u64, b: u64) -> u64 {
    a / gcd(a, b) * b
}

#[cfg(test)]
mod tests {
    use super::{gcd, lcm};

    #[test]
    fn gcd_and_lcm() {
        assert_eq!(gcd(896, 4096), 128);
        assert_eq!(gcd(2, 4096), 2);
        assert_eq!(lcm(4096 / 128, 4096 / 2), 2048);
        assert_eq!(lcm(1, 7), 7);
    }
}
