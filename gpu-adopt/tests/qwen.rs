//! Qwen2 decoding on adopted weights: every parameter of the model is its store file's mapping
//! on the GPU, and the model produces what Hugging Face transformers produced for the tiny
//! fixture, and the same tokens and logits as the resident placement; a mid-size random Qwen2
//! shows the memory difference and both decode rates.

mod common;
#[allow(dead_code)]
#[path = "../examples/qwen/load.rs"]
mod load;

use std::path::PathBuf;
use std::time::Instant;

use burn::store::{ModuleStore, SafetensorsStore};
use burn::tensor::Device;
use burn_mapped::host::memstat::rss_self;
use burn_mapped::{MappedRecorder, MappedStore, Placement};
use burn_mapped_models::qwen2::{Qwen2Config, Qwen2ForCausalLM, VocabBlocks, VocabEmbed};
use common::{digest_dir, gpu, importing, open_strict};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/tests/fixtures/tiny_qwen2/tied")
}

/// The tests of this file run one at a time: the mid-size one reads the process's anonymous
/// memory, which the other would move.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The tiny transformers fixture written as a store, and what transformers produced for it.
struct Tiny {
    _dir: tempfile::TempDir,
    store_dir: PathBuf,
    store: MappedStore,
    config: Qwen2Config,
    prompt: Vec<u32>,
    generated: Vec<u32>,
    vocab: usize,
    /// One row per prompt position, then one per decode step.
    hf: Vec<f32>,
}

fn tiny() -> Tiny {
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    let config = Qwen2Config::from_hf_json(fixture().join("config.json")).unwrap();
    let mut host = config.init(&Device::flex());
    let applied = SafetensorsStore::from_file(fixture().join("model.safetensors"))
        .apply_to(&mut host)
        .unwrap();
    assert!(
        applied.errors.is_empty() && applied.missing.is_empty(),
        "{applied:?}"
    );
    MappedRecorder::default().record(&host, &store_dir).unwrap();
    let store = open_strict(&store_dir);
    let reference: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture().join("reference.json")).unwrap()).unwrap();
    let ids = |k: &str| -> Vec<u32> {
        reference[k]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect()
    };
    let hf: Vec<f32> = std::fs::read(fixture().join("logits.f32"))
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    Tiny {
        _dir: dir,
        store_dir,
        store,
        config,
        prompt: ids("prompt"),
        generated: ids("generated"),
        vocab: reference["vocab_size"].as_u64().unwrap() as usize,
        hf,
    }
}

impl Tiny {
    /// Decodes the fixture prompt; asserts transformers' tokens and logits within 1e-4
    /// (relative to each row's largest logit). Returns the logits rows.
    fn decode_like_transformers(&self, model: &Qwen2ForCausalLM, what: &str) -> Vec<Vec<f32>> {
        let gpu = gpu().unwrap();
        let steps = self.generated.len() - 1;
        let (tokens, rows, _) = load::greedy(model, &self.prompt, steps, gpu.device());
        assert_eq!(
            tokens, self.generated,
            "{what}: greedy tokens differ from transformers"
        );
        let vocab = self.vocab;
        let mut worst = 0f64;
        for (i, row) in rows.iter().enumerate() {
            let want = &self.hf[i * vocab..(i + 1) * vocab];
            let scale = want.iter().fold(0f64, |m, v| m.max(f64::from(v.abs())));
            let err = row
                .iter()
                .zip(want)
                .fold(0f64, |m, (g, w)| m.max(f64::from((g - w).abs())));
            worst = worst.max(err / scale);
        }
        eprintln!("{what} vs transformers: worst relative logits error {worst:.2e}");
        assert!(worst < 1e-4, "{what}: {worst}");
        rows
    }
}

#[test]
fn tiny_qwen2_on_adopted_weights_matches_transformers_and_the_resident_placement() {
    let _serial = serial();
    let Some(gpu) = importing() else { return };
    let t = tiny();
    let (store, config) = (&t.store, &t.config);
    let before = digest_dir(&t.store_dir);

    let (adopted, report) = gpu
        .load_module(config.init(gpu.device()), store, true)
        .unwrap();
    assert!(report.resident.is_empty(), "{:?}", report.resident);
    assert_eq!(report.mapped.len(), store.manifest().tensors().len());
    // Identity: the embedding the model reads is the buffer imported from its file.
    let name = "model.embed_tokens.weight";
    let weight = adopted.model.embed_tokens.weight.val();
    let buffer = gpu.backing(&weight).unwrap().vk_buffer;
    let import = gpu
        .live_imports()
        .into_iter()
        .find(|i| i.vk_buffer == buffer)
        .expect("the embedding is an import");
    assert_eq!(import.tensor, name);
    assert_eq!(import.address, store.mapped(name).unwrap().address_range());
    drop(weight);
    let rows_map = t.decode_like_transformers(&adopted, "adopted");

    let (resident, report) = gpu
        .load_module(config.init(gpu.device()), store, false)
        .unwrap();
    assert!(report.mapped.is_empty());
    let rows_res = t.decode_like_transformers(&resident, "resident");
    assert_eq!(
        rows_res, rows_map,
        "same kernels on the same bytes: bitwise equal"
    );
    drop((adopted, resident));
    gpu.cleanup();
    assert_eq!(digest_dir(&t.store_dir), before, "store files unchanged");
}

/// The tiny fixture's (tied) embedding adopted as row blocks, each imported from its own part
/// of the one file mapping: what the real checkpoint's 545 MB embedding needs on lavapipe, at
/// a size checked against transformers. The lookup gathers from the blocks and the tied head
/// multiplies by each block. Blocks off the import granularity load resident and say why; a
/// zero block size is refused.
#[test]
fn tiny_qwen2_on_adopted_row_blocks_matches_transformers() {
    let _serial = serial();
    let Some(gpu) = importing() else { return };
    let t = tiny();
    let before = digest_dir(&t.store_dir);
    let name = load::EMBED;
    let entry = t.store.manifest().get(name).unwrap();
    let row_bytes = (entry.len() / entry.shape()[0] as u64) as usize;
    let align = gpu.import_alignment().unwrap() as usize;
    // Three import pages per block: several blocks, the last one short.
    let rows = 3 * align / row_bytes;
    assert!(
        rows > 0 && !t.vocab.is_multiple_of(rows) && t.vocab / rows >= 2,
        "{rows}"
    );

    let (model, report) = gpu
        .load_module_except(t.config.init(gpu.device()), &t.store, true, &[name])
        .unwrap();
    assert_eq!(report.left, [name]);
    assert!(report.resident.is_empty(), "{:?}", report.resident);
    let blocks = gpu
        .load_float_rows::<2>(&t.store, name, rows, true)
        .unwrap();
    assert_eq!(blocks.len(), t.vocab.div_ceil(rows));
    let mapping = t.store.mapped(name).unwrap().address_range();
    let imports = gpu.live_imports();
    for (k, (block, placement)) in blocks.iter().enumerate() {
        assert_eq!(placement.placement, Placement::Map, "block {k}");
        let buffer = gpu.backing(block).unwrap().vk_buffer;
        let import = imports
            .iter()
            .find(|i| i.vk_buffer == buffer)
            .unwrap_or_else(|| panic!("block {k} is not an import"));
        let start = mapping.start + k * rows * row_bytes;
        let end = if k + 1 == blocks.len() {
            mapping.end
        } else {
            start + rows * row_bytes
        };
        assert_eq!(
            (&import.tensor[..], import.address.clone()),
            (name, start..end)
        );
    }
    let embed = blocks.into_iter().map(|(b, _)| b).collect();
    let model = model
        .with_vocab_blocks(VocabBlocks {
            embed: VocabEmbed::RowBlocks(embed),
            head: None,
        })
        .unwrap();
    t.decode_like_transformers(&model, "adopted row blocks");
    drop(model);

    // Blocks of 100 rows: every block but the last ends off the import granularity, and
    // every block but the first starts off it, so none can be imported.
    assert!(!(100 * row_bytes).is_multiple_of(align));
    let odd = gpu.load_float_rows::<2>(&t.store, name, 100, true).unwrap();
    assert_eq!(odd.len(), 3);
    for (k, (_, placement)) in odd.iter().enumerate() {
        let Some(reason) = &placement.refused else {
            panic!("block {k} of 100 rows adopted off the granularity");
        };
        assert_eq!(placement.placement, Placement::Resident);
        assert!(reason.contains("granularity"), "{reason}");
    }
    let zero = gpu
        .load_float_rows::<2>(&t.store, name, 0, true)
        .unwrap_err();
    assert!(
        matches!(zero, burn_mapped_gpu::AdoptError::Blocks { block: 0, .. }),
        "{zero}"
    );
    drop(odd);
    gpu.cleanup();
    assert_eq!(digest_dir(&t.store_dir), before, "store files unchanged");
}

/// A random Qwen2 of ~150 MiB (every tensor within lavapipe's 128 MiB binding limit, which the
/// real 0.5B checkpoint's 545 MB embedding exceeds): tokens equal under both placements;
/// adopting adds no anonymous memory at load, loading resident adds the weights (on lavapipe
/// device memory is host memory). Prints both decode rates and the memory after decoding too
/// (activations and CubeCL's pools, which the second run reuses).
#[test]
fn a_mid_size_qwen2_decodes_adopted_without_anonymous_growth() {
    let _serial = serial();
    let Some(gpu) = importing() else { return };
    let config = Qwen2Config {
        vocab_size: 32000,
        hidden_size: 512,
        intermediate_size: 1408,
        num_hidden_layers: 8,
        num_attention_heads: 8,
        num_key_value_heads: 2,
        head_dim: 64,
        rms_norm_eps: 1e-6,
        rope_theta: 10000.0,
        max_position_embeddings: 256,
        tie_word_embeddings: true,
    };
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    MappedRecorder::default()
        .record(&config.init(&Device::flex()), &store_dir)
        .unwrap();
    let store = open_strict(&store_dir);
    let weights: u64 = store.manifest().tensors().iter().map(|t| t.len()).sum();
    let prompt = [1u32, 17, 400, 9, 31000, 5, 77];
    let steps = 16;
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;

    let mut figures = Vec::new();
    let mut tokens = Vec::new();
    for adopt in [true, false] {
        let anon0 = rss_self().unwrap().anon;
        let start = Instant::now();
        let (model, report) = gpu
            .load_module(config.init(gpu.device()), &store, adopt)
            .unwrap();
        let ready = start.elapsed();
        let at_load = rss_self().unwrap().anon.saturating_sub(anon0);
        let (got, _, rate) = load::greedy(&model, &prompt, steps, gpu.device());
        let at_decode = rss_self().unwrap().anon.saturating_sub(anon0);
        let (mapped, resident) = report.bytes(&store);
        eprintln!(
            "{}: model-ready {:.1} ms, decode {rate:.2} tok/s, RssAnon +{:.1} MiB after load, +{:.1} MiB after {steps} tokens (weights {:.1} MiB: {:.1} mapped, {:.1} resident)",
            if adopt { "map" } else { "resident" },
            ready.as_secs_f64() * 1e3,
            mib(at_load),
            mib(at_decode),
            mib(weights),
            mib(mapped),
            mib(resident),
        );
        figures.push((at_load, mapped, resident));
        tokens.push(got);
        drop(model);
        gpu.cleanup();
    }
    assert_eq!(
        tokens[0], tokens[1],
        "map and resident choose the same tokens"
    );
    let (map, res) = (figures[0], figures[1]);
    assert_eq!((map.1, map.2), (weights, 0), "every weight adopted");
    assert_eq!((res.1, res.2), (0, weights), "every weight resident");
    assert!(
        (map.0 as f64) < 0.1 * weights as f64,
        "adopting grew RssAnon by {:.1} MiB",
        mib(map.0)
    );
    assert!(
        (res.0 as f64) > 0.9 * weights as f64,
        "loading resident grew RssAnon by only {:.1} MiB of {:.1}",
        mib(res.0),
        mib(weights)
    );
}
