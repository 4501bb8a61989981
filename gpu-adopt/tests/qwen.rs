//! Qwen2 decoding on adopted weights: every parameter of the model is its store file's mapping
//! on the GPU, and the model produces what Hugging Face transformers produced for the tiny
//! fixture, and the same tokens and logits as the resident placement; a mid-size random Qwen2
//! shows the memory difference and both decode rates.

mod common;

use std::path::PathBuf;
use std::time::Instant;

use burn::store::{ModuleStore, SafetensorsStore};
use burn::tensor::{Device, Int, Tensor, TensorData};
use burn_mapped::memstat::rss_self;
use burn_mapped::{MappedRecorder, MappedStore};
use burn_mapped_gpu::GpuDevice;
use burn_mapped_models::qwen2::{Qwen2Config, Qwen2ForCausalLM, argmax};
use common::{digest_dir, gpu};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/tests/fixtures/tiny_qwen2/tied")
}

/// The tests of this file run one at a time: the mid-size one reads the process's anonymous
/// memory, which the other would move.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn importing() -> Option<&'static GpuDevice> {
    let gpu = gpu()?;
    match gpu.host_import() {
        Ok(()) => Some(gpu),
        Err(reason) => {
            eprintln!(
                "skipping: no host import on {}: {reason}",
                gpu.adapter_name()
            );
            None
        }
    }
}

/// Greedy decoding: the prompt, then `steps` cached single-token steps. Returns the chosen
/// tokens (first from the prefill), every logits row (prefill rows, then one per step) and
/// the decode rate over the steps.
fn greedy(
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

#[test]
fn tiny_qwen2_on_adopted_weights_matches_transformers_and_the_resident_placement() {
    let _serial = serial();
    let Some(gpu) = importing() else { return };
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
    let before = digest_dir(&store_dir);
    let store = MappedStore::open(&store_dir).unwrap();

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
    let (prompt, generated) = (ids("prompt"), ids("generated"));
    let vocab = reference["vocab_size"].as_u64().unwrap() as usize;
    let hf: Vec<f32> = std::fs::read(fixture().join("logits.f32"))
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();

    let (adopted, report) = gpu
        .load_module(config.init(gpu.device()), &store, true)
        .unwrap();
    assert!(report.resident.is_empty(), "{:?}", report.resident);
    assert_eq!(report.mapped.len(), store.manifest().tensors().len());
    // Identity: the embedding the model reads is the buffer imported from its file.
    let name = "model.embed_tokens.weight";
    let import = gpu
        .live_imports()
        .into_iter()
        .find(|i| i.tensor == name)
        .expect(name);
    let weight = adopted.model.embed_tokens.weight.val();
    assert_eq!(gpu.backing(&weight).unwrap().vk_buffer, import.vk_buffer);
    assert_eq!(import.address, store.mapped(name).unwrap().address_range());
    drop(weight);

    let steps = generated.len() - 1;
    let (tokens_map, rows_map, _) = greedy(&adopted, &prompt, steps, gpu.device());
    assert_eq!(
        tokens_map, generated,
        "adopted: greedy tokens differ from transformers"
    );
    let mut worst = 0f64;
    for (i, row) in rows_map.iter().enumerate() {
        let want = &hf[i * vocab..(i + 1) * vocab];
        let scale = want.iter().fold(0f64, |m, v| m.max(f64::from(v.abs())));
        let err = row
            .iter()
            .zip(want)
            .fold(0f64, |m, (g, w)| m.max(f64::from((g - w).abs())));
        worst = worst.max(err / scale);
    }
    eprintln!("adopted vs transformers: worst relative logits error {worst:.2e}");
    assert!(worst < 1e-4, "{worst}");

    let (resident, report) = gpu
        .load_module(config.init(gpu.device()), &store, false)
        .unwrap();
    assert!(report.mapped.is_empty());
    let (tokens_res, rows_res, _) = greedy(&resident, &prompt, steps, gpu.device());
    assert_eq!(tokens_res, tokens_map);
    assert_eq!(
        rows_res, rows_map,
        "same kernels on the same bytes: bitwise equal"
    );
    drop((adopted, resident));
    gpu.cleanup();
    assert_eq!(digest_dir(&store_dir), before, "store files unchanged");
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
    let store = MappedStore::open(&store_dir).unwrap();
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
        let (got, _, rate) = greedy(&model, &prompt, steps, gpu.device());
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
