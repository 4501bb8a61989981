//! The embedding and LM head read from vocabulary row blocks (how a device with a small
//! binding limit runs a large vocabulary) reproduce transformers' logits and tokens for the
//! tiny fixtures. The whole matrices are zeroed after the blocks are cut from them, so a model
//! that still read them would fail the comparison.

use crate::common;

use burn::module::Param;
use burn::tensor::Tensor;
use burn_mapped_models::qwen2::{
    Projection, Qwen2ForCausalLM, VocabBlocks, VocabBlocksError, VocabEmbed,
};
use burn_mapped_tests::tiny_qwen2::{decode_like_transformers, reference};
use common::load;

/// Uneven blocks of the fixtures' 256-row vocabulary, one of a single row.
const SPLIT: [usize; 3] = [100, 1, 155];

fn row_blocks(whole: Tensor<2>, split: &[usize]) -> Vec<Tensor<2>> {
    let mut start = 0;
    split
        .iter()
        .map(|&rows| {
            let block = whole.clone().narrow(0, start, rows);
            start += rows;
            block
        })
        .collect()
}

/// The fixture model on blocks cut from its own weights, its whole matrices zeroed.
fn blocked(variant: &str, split: &[usize]) -> Qwen2ForCausalLM {
    let mut model = load(variant);
    let embed = model.model.embed_tokens.weight.val();
    let blocks = VocabBlocks {
        embed: VocabEmbed::RowBlocks(row_blocks(embed.clone(), split)),
        head: model.lm_head.as_ref().map(|head| {
            let Projection::Float(linear) = head else {
                panic!("float fixture")
            };
            // The `Col` layout holds `[in, out]`; blocks are `[out, in]` like the store.
            let weight = linear.weight.val().transpose();
            row_blocks(weight, split)
                .into_iter()
                .map(Projection::from_weight)
                .collect()
        }),
    };
    model.model.embed_tokens.weight = Param::from_tensor(embed.zeros_like());
    if let Some(Projection::Float(linear)) = &mut model.lm_head {
        linear.weight = Param::from_tensor(linear.weight.val().zeros_like());
    }
    model.with_vocab_blocks(blocks).unwrap()
}

#[test]
fn tied_blocks_decode_like_transformers() {
    let r = reference("tied");
    // The prompt's ids fall in more than one block, so the lookup reorders gathered rows.
    assert!(r.prompt.iter().any(|&t| t < 100) && r.prompt.iter().any(|&t| t >= 101));
    decode_like_transformers(&blocked("tied", &SPLIT), &r, "tied, blocks", |_| {});
}

#[test]
fn untied_blocks_decode_like_transformers() {
    let r = reference("untied");
    decode_like_transformers(&blocked("untied", &SPLIT), &r, "untied, blocks", |_| {});
}

#[test]
fn one_block_is_the_whole_matrix() {
    let r = reference("tied");
    decode_like_transformers(&blocked("tied", &[256]), &r, "tied, one block", |_| {});
}

#[test]
fn blocks_that_do_not_fit_are_refused() {
    let tied = load("tied");
    let embed = tied.model.embed_tokens.weight.val();
    let refuse = |model: Qwen2ForCausalLM, blocks: VocabBlocks| {
        model.with_vocab_blocks(blocks).map(|_| ()).unwrap_err()
    };
    let err = refuse(
        load("tied"),
        VocabBlocks {
            embed: VocabEmbed::RowBlocks(row_blocks(embed.clone(), &[100, 100])),
            head: None,
        },
    );
    assert_eq!(
        err,
        VocabBlocksError::Rows {
            what: "embedding",
            rows: 200,
            vocab: 256
        }
    );
    let err = refuse(
        load("tied"),
        VocabBlocks {
            embed: VocabEmbed::RowBlocks(vec![
                embed.clone().narrow(1, 0, 32),
                embed.clone().narrow(1, 0, 32),
            ]),
            head: None,
        },
    );
    assert!(
        matches!(
            err,
            VocabBlocksError::Width {
                width: 32,
                hidden: 64,
                ..
            }
        ),
        "{err}"
    );
    let err = refuse(
        load("tied"),
        VocabBlocks {
            embed: VocabEmbed::RowBlocks(Vec::new()),
            head: None,
        },
    );
    assert_eq!(err, VocabBlocksError::Empty { what: "embedding" });
    // A head for a tied model, and none for an untied one.
    let head = vec![Projection::from_weight(embed.clone())];
    let err = refuse(
        load("tied"),
        VocabBlocks {
            embed: VocabEmbed::RowBlocks(vec![embed.clone()]),
            head: Some(head.clone()),
        },
    );
    assert!(matches!(err, VocabBlocksError::Tying { .. }), "{err}");
    let err = refuse(
        load("untied"),
        VocabBlocks {
            embed: VocabEmbed::RowBlocks(vec![embed.clone()]),
            head: None,
        },
    );
    assert!(matches!(err, VocabBlocksError::Tying { .. }), "{err}");
    // A head whose blocks miss a row.
    let err = refuse(
        load("untied"),
        VocabBlocks {
            embed: VocabEmbed::RowBlocks(vec![embed.clone()]),
            head: Some(vec![Projection::from_weight(embed.narrow(0, 0, 255))]),
        },
    );
    assert_eq!(
        err,
        VocabBlocksError::Rows {
            what: "head",
            rows: 255,
            vocab: 256
        }
    );
}
