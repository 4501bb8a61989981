//! The vocabulary-sized matrices (embedding, LM head) held outside the module's float
//! embedding: as consecutive row blocks, or as the checkpoint's own quantized blocks.
//!
//! A GPU kernel binds each tensor it reads as one storage buffer, and drivers cap a binding's
//! size: Mesa's lavapipe at 128 MiB, while Qwen2.5-0.5B's f32 embedding is 545 MB and even its
//! int8 LM head is 136 MB. Split by vocabulary rows, each block binds on its own; the lookup
//! gathers from the block holding each id and the head concatenates the blocks' logits, so the
//! model computes the same values as with whole matrices.
//!
//! A GGUF read in place keeps its embedding as quantized blocks (Q5_0, Q8_0, ...): each
//! looked-up row is dequantized when it is used, and a tied head is a block product over the
//! same bytes, so no f32 copy of the table exists.

use burn::tensor::{Device, Int, Tensor, TensorData};
use burn_mapped::blocks::{BlockWeight, block_linear};

use super::projection::Projection;

/// The embedding's rows, as [`VocabBlocks`] holds them.
#[derive(Clone)]
pub enum VocabEmbed {
    /// Float row blocks: block `i` is `[rows_i, hidden]`.
    RowBlocks(Vec<Tensor<2>>),
    /// The whole table as quantized GGUF blocks, `[vocab, row_bytes]` on Flex (boxed: a
    /// tensor handle is large beside a vector of them).
    Quantized(Box<BlockWeight>),
}

/// The model's vocabulary matrices, in vocabulary order.
#[derive(Clone)]
pub struct VocabBlocks {
    /// Rows of `model.embed_tokens.weight`.
    pub embed: VocabEmbed,
    /// The LM head as projections onto consecutive vocabulary slices; `None` when the head is
    /// tied to the embedding (its logits then come from the embedding), or, beside a
    /// [`VocabEmbed::Quantized`] embedding, when the model's own `lm_head` serves.
    pub head: Option<Vec<Projection>>,
}

/// Shapes only: a tensor's own `Debug` reads its values back from the device.
impl std::fmt::Debug for VocabBlocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let embed: Vec<[usize; 2]> = match &self.embed {
            VocabEmbed::RowBlocks(blocks) => blocks.iter().map(Tensor::dims).collect(),
            VocabEmbed::Quantized(w) => vec![[w.out_features(), w.in_features()]],
        };
        let head: Option<Vec<(usize, usize)>> = self
            .head
            .as_ref()
            .map(|h| h.iter().map(Projection::dims).collect());
        f.debug_struct("VocabBlocks")
            .field("embed", &embed)
            .field("head", &head)
            .finish()
    }
}

/// Why row blocks do not fit a model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VocabBlocksError {
    #[error("no {what} blocks given")]
    Empty { what: &'static str },
    #[error("{what} block {index} is [{rows}, {width}], the model's hidden size is {hidden}")]
    Width {
        what: &'static str,
        index: usize,
        rows: usize,
        width: usize,
        hidden: usize,
    },
    #[error("the {what} blocks hold {rows} rows, the vocabulary has {vocab}")]
    Rows {
        what: &'static str,
        rows: usize,
        vocab: usize,
    },
    #[error("the model's LM head is {model}, the blocks give it {given}")]
    Tying {
        model: &'static str,
        given: &'static str,
    },
}

impl VocabBlocks {
    /// Checks the blocks against a model's vocabulary and hidden size, and whether its head is
    /// tied.
    pub(crate) fn check(
        &self,
        vocab: usize,
        hidden: usize,
        tied: bool,
    ) -> Result<(), VocabBlocksError> {
        let kind = |tied: bool| if tied { "tied" } else { "separate" };
        // A quantized embedding leaves a separate head to the model's own projection.
        let head_elsewhere = !tied && matches!(self.embed, VocabEmbed::Quantized(_));
        if tied != self.head.is_none() && !head_elsewhere {
            return Err(VocabBlocksError::Tying {
                model: kind(tied),
                given: kind(self.head.is_none()),
            });
        }
        let embed: Vec<(usize, usize)> = match &self.embed {
            VocabEmbed::RowBlocks(blocks) => blocks
                .iter()
                .map(|b| {
                    let [rows, width] = b.dims();
                    (rows, width)
                })
                .collect(),
            VocabEmbed::Quantized(w) => vec![(w.out_features(), w.in_features())],
        };
        check_blocks("embedding", embed.into_iter(), vocab, hidden)?;
        if let Some(head) = &self.head {
            check_blocks(
                "head",
                head.iter().map(|p| {
                    let (d_in, d_out) = p.dims();
                    (d_out, d_in)
                }),
                vocab,
                hidden,
            )?;
        }
        Ok(())
    }

    /// Embeddings `[ids.len(), hidden]` of `ids` (already checked to be in the vocabulary):
    /// one gather per block that holds any of them, then one reordering gather when more
    /// than one block was involved.
    pub(crate) fn lookup(&self, ids: &[i64], device: &Device) -> Tensor<2> {
        let blocks = match &self.embed {
            VocabEmbed::RowBlocks(blocks) => blocks,
            VocabEmbed::Quantized(w) => {
                let ids: Vec<usize> = ids.iter().map(|&id| id as usize).collect();
                let mut rows = Vec::with_capacity(ids.len() * w.in_features());
                w.dequantize_rows(&ids, &mut rows)
                    .expect("ids are checked against the vocabulary before the lookup");
                return Tensor::from_data(
                    TensorData::new(rows, [ids.len(), w.in_features()]),
                    device,
                );
            }
        };
        let index = |v: Vec<i64>| {
            let n = v.len();
            Tensor::<1, Int>::from_data(TensorData::new(v, [n]), device)
        };
        let mut parts = Vec::new();
        // `order[k]` is the input position of the k-th gathered row.
        let mut order = Vec::with_capacity(ids.len());
        let mut start = 0i64;
        for block in blocks {
            let end = start + block.dims()[0] as i64;
            let local: Vec<i64> = ids
                .iter()
                .enumerate()
                .filter(|&(_, &id)| (start..end).contains(&id))
                .map(|(pos, &id)| {
                    order.push(pos);
                    id - start
                })
                .collect();
            if !local.is_empty() {
                parts.push(block.clone().select(0, index(local)));
            }
            start = end;
        }
        // Within a block the gather keeps input order, so one block needs no reordering.
        if parts.len() == 1 {
            return parts.remove(0);
        }
        let mut inverse = vec![0i64; order.len()];
        for (k, &pos) in order.iter().enumerate() {
            inverse[pos] = k as i64;
        }
        Tensor::cat(parts, 0).select(0, index(inverse))
    }

    /// Logits `[rows, vocab]` of `hidden` (`[rows, hidden]`): each block's slice, concatenated.
    pub(crate) fn logits(&self, hidden: Tensor<2>) -> Tensor<2> {
        let slices = match (&self.head, &self.embed) {
            (Some(head), _) => head.iter().map(|p| p.forward(hidden.clone())).collect(),
            // `[rows, hidden]` transposed is a view; no copy of the block.
            (None, VocabEmbed::RowBlocks(blocks)) => blocks
                .iter()
                .map(|b| burn::tensor::module::linear(hidden.clone(), b.clone().transpose(), None))
                .collect(),
            (None, VocabEmbed::Quantized(w)) => {
                return block_linear(hidden, w, None)
                    .unwrap_or_else(|e| panic!("tied head over the embedding's blocks: {e}"));
            }
        };
        Tensor::cat(slices, 1)
    }

    /// The embedding's quantized blocks, when it is held so (the host step looks rows up in
    /// them itself).
    pub(crate) fn quantized_embed(&self) -> Option<&BlockWeight> {
        match &self.embed {
            VocabEmbed::Quantized(w) => Some(w),
            VocabEmbed::RowBlocks(_) => None,
        }
    }
}

fn check_blocks(
    what: &'static str,
    blocks: impl Iterator<Item = (usize, usize)>,
    vocab: usize,
    hidden: usize,
) -> Result<(), VocabBlocksError> {
    let mut total = 0;
    let mut count = 0;
    for (index, (rows, width)) in blocks.enumerate() {
        if width != hidden {
            return Err(VocabBlocksError::Width {
                what,
                index,
                rows,
                width,
                hidden,
            });
        }
        total += rows;
        count += 1;
    }
    if count == 0 {
        return Err(VocabBlocksError::Empty { what });
    }
    if total != vocab {
        return Err(VocabBlocksError::Rows {
            what,
            rows: total,
            vocab,
        });
    }
    Ok(())
}
