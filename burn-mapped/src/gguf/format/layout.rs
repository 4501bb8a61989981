//! How GGUF blocks are laid out as a store tensor.

use super::{GgmlType, can_dequantize};

/// Marks a tensor as quantized GGUF blocks kept exactly as the checkpoint holds them: a `u8`
/// tensor `[rows, row_bytes]` whose every row is `cols / block_size` whole blocks of `ty`, so a
/// row never straddles a block and a thread given whole rows reads whole blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockLayout {
    ty: GgmlType,
    cols: usize,
}

impl BlockLayout {
    /// `cols` values per row in blocks of `ty`.
    ///
    /// # Errors
    ///
    /// The reason, when `ty` is not a block type the store knows (one that
    /// [`can_dequantize`] decodes, other than the plain floats) or `cols` is not a positive
    /// multiple of its block size.
    pub fn new(ty: GgmlType, cols: usize) -> Result<Self, &'static str> {
        if ty.block_size() == 1 || !can_dequantize(ty) {
            return Err("not a block type the store knows");
        }
        if cols == 0 || !(cols as u64).is_multiple_of(ty.block_size()) {
            return Err("columns are not a positive multiple of the block size");
        }
        Ok(Self { ty, cols })
    }

    /// The block type.
    pub fn ty(self) -> GgmlType {
        self.ty
    }

    /// Values per row.
    pub fn cols(self) -> usize {
        self.cols
    }

    /// Bytes per row: `cols / block_size` blocks.
    pub fn row_bytes(self) -> usize {
        self.cols / self.ty.block_size() as usize * self.ty.type_size() as usize
    }
}
