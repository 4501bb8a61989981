//! Qwen2 from a store onto a [`GpuDevice`]: every parameter adopted (or copied resident), and
//! the vocabulary matrices split into row blocks when one of them exceeds the device's
//! largest binding (Qwen2.5-0.5B's on lavapipe); and greedy decoding. Shared by the `qwen`
//! example and the tests.

use std::time::Instant;

use burn::tensor::{Device, Int, Tensor, TensorData};
use burn_mapped::q8::scale_name;
use burn_mapped::{MappedStore, Placement};
use burn_mapped_gpu::{GpuDevice, ModuleReport, Placed};
pub use burn_mapped_models::qwen2::load::{EMBED_TOKENS as EMBED, LM_HEAD as HEAD};
use burn_mapped_models::qwen2::{
    Projection, Qwen2ForCausalLM, VocabBlocks, VocabEmbed, argmax, config_from_manifest,
};

/// A model on the device, and where its weights went.
pub struct Loaded {
    pub model: Qwen2ForCausalLM,
    /// Every parameter loaded whole (the vocabulary matrices are `left` when split).
    pub report: ModuleReport,
    /// Rows per vocabulary block, when the vocabulary matrices were split.
    pub block_rows: Option<usize>,
    /// Each vocabulary block's tensor name, rows and placement, in order.
    pub blocks: Vec<(String, std::ops::Range<usize>, Placed)>,
}

impl Loaded {
    /// Bytes adopted and copied, over parameters and blocks: `(mapped, resident)`.
    pub fn bytes(&self, store: &MappedStore) -> (u64, u64) {
        let (mut mapped, mut resident) = self.report.bytes(store);
        for (name, rows, placed) in &self.blocks {
            let entry = store.manifest().get(name).expect("block of a store tensor");
            let per_row = entry.len() / entry.shape()[0] as u64;
            let bytes = per_row * rows.len() as u64;
            match placed.placement {
                Placement::Map => mapped += bytes,
                _ => resident += bytes,
            }
        }
        (mapped, resident)
    }
}

/// Loads the Qwen2 model of `store` (converted from GGUF: its config is in the manifest) onto
/// `gpu`, adopting every tensor the device imports when `adopt` is true.
pub fn load_qwen(
    gpu: &GpuDevice,
    store: &MappedStore,
    adopt: bool,
) -> Result<Loaded, Box<dyn std::error::Error>> {
    let manifest = store.manifest();
    let config = config_from_manifest(manifest)?;
    let model = config.try_init_for_store(gpu.device(), manifest)?;
    let head_q8 = model.lm_head.as_ref().map(Projection::is_q8);
    let head_scale = scale_name(HEAD);
    let mut names = vec![EMBED];
    match head_q8 {
        Some(true) => names.extend([HEAD, head_scale.as_str()]),
        Some(false) => names.push(HEAD),
        None => {}
    }
    let too_large = names
        .iter()
        .any(|n| manifest.get(n).is_some_and(|e| e.len() > gpu.max_binding()));
    if !too_large {
        let (model, report) = gpu.load_module(model, store, adopt)?;
        return Ok(Loaded {
            model,
            report,
            block_rows: None,
            blocks: Vec::new(),
        });
    }
    let (model, report) = gpu.load_module_except(model, store, adopt, &names)?;
    let rows = gpu.block_rows(store, &names)?;
    let mut blocks = Vec::new();
    let embed = placed(
        EMBED,
        gpu.load_float_rows::<2>(store, EMBED, rows, adopt)?,
        |t| t.dims()[0],
        &mut blocks,
    );
    let head = match head_q8 {
        None => None,
        Some(true) => {
            let values = placed(
                HEAD,
                gpu.load_int_rows::<2>(store, HEAD, rows, adopt)?,
                |t| t.dims()[0],
                &mut blocks,
            );
            let scales = placed(
                &head_scale,
                gpu.load_float_rows::<1>(store, &head_scale, rows, adopt)?,
                |t| t.dims()[0],
                &mut blocks,
            );
            Some(
                values
                    .into_iter()
                    .zip(scales)
                    .map(|(v, s)| Projection::from_q8(v, s))
                    .collect(),
            )
        }
        Some(false) => {
            let weights = placed(
                HEAD,
                gpu.load_float_rows::<2>(store, HEAD, rows, adopt)?,
                |t| t.dims()[0],
                &mut blocks,
            );
            Some(weights.into_iter().map(Projection::from_weight).collect())
        }
    };
    let model = model.with_vocab_blocks(VocabBlocks {
        embed: VocabEmbed::RowBlocks(embed),
        head,
    })?;
    Ok(Loaded {
        model,
        report,
        block_rows: Some(rows),
        blocks,
    })
}

/// The tensors of `loaded` blocks of `name`, noting in `blocks` each one's rows (counted by
/// `rows`) and placement.
fn placed<T>(
    name: &str,
    loaded: Vec<(T, Placed)>,
    rows: impl Fn(&T) -> usize,
    blocks: &mut Vec<(String, std::ops::Range<usize>, Placed)>,
) -> Vec<T> {
    let mut start = 0;
    loaded
        .into_iter()
        .map(|(tensor, placed)| {
            let n = rows(&tensor);
            blocks.push((name.to_string(), start..start + n, placed));
            start += n;
            tensor
        })
        .collect()
}

/// Greedy decoding: the prompt, then `steps` cached single-token steps. Returns the chosen
/// tokens (first from the prefill), every logits row (prefill rows, then one per step) and
/// the decode rate over the steps.
pub fn greedy(
    model: &Qwen2ForCausalLM,
    prompt: &[u32],
    steps: usize,
    device: &Device,
) -> (Vec<u32>, Vec<Vec<f32>>, f64) {
    let tokens = |ids: &[u32]| {
        Tensor::<2, Int>::from_data(
            TensorData::new(ids.iter().map(|&t| i64::from(t)).collect(), [1, ids.len()]),
            device,
        )
    };
    let rows = |logits: Tensor<3>| -> Vec<Vec<f32>> {
        let vocab = logits.dims()[2];
        let flat = logits.into_data().try_to_vec::<f32>().unwrap();
        flat.chunks(vocab).map(<[f32]>::to_vec).collect()
    };
    let mut cache = model.new_cache(1, prompt.len() + steps);
    let mut all = rows(model.forward(tokens(prompt), &mut cache).unwrap());
    let mut token = argmax(all.last().unwrap()).unwrap();
    let mut chosen = vec![token];
    let start = Instant::now();
    for _ in 0..steps {
        let row = rows(model.forward(tokens(&[token]), &mut cache).unwrap()).remove(0);
        token = argmax(&row).unwrap();
        chosen.push(token);
        all.push(row);
    }
    let rate = steps as f64 / start.elapsed().as_secs_f64();
    (chosen, all, rate)
}
