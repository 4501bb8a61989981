//! A Qwen2 store with q8 projections: the model picks `Q8Linear` from the manifest, loads
//! by the same module paths, and computes what the float model computes on the dequantized
//! weights (the float path itself is checked against transformers elsewhere).

use std::path::Path;

use burn::module::{Module, ModuleVisitor, Param};
use burn::store::ModuleSnapshot;
use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use burn_mapped::q8::{dequantize_rows, quantize_rows, write_q8};
use burn_mapped::{MappedStore, StoreWriter, TensorSpec};
use burn_mapped_models::qwen2::{Qwen2Config, Qwen2ForCausalLM, argmax};
use burn_mapped_tests::tiny_qwen2::{fixture, relative_error};

/// Every tensor of a float32 safetensors file: name, shape, values.
fn read_safetensors(path: &Path) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    let mut out: Vec<_> = header
        .into_iter()
        .filter(|(k, _)| k != "__metadata__")
        .map(|(name, v)| {
            assert_eq!(v["dtype"], "F32", "{name}");
            let shape = burn_mapped_tests::json::usizes(&v["shape"]);
            let off = v["data_offsets"].as_array().unwrap();
            let (a, b) = (
                off[0].as_u64().unwrap() as usize,
                off[1].as_u64().unwrap() as usize,
            );
            let values = data[a..b]
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            (name, shape, values)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn is_projection(name: &str) -> bool {
    name.ends_with("_proj.weight") || name == "lm_head.weight"
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Writes the fixture twice: with q8 projections, and all-float with those projections
/// replaced by their dequantized values.
fn write_stores(variant: &str, q8_dir: &Path, deq_dir: &Path) {
    let tensors = read_safetensors(&fixture(variant).join("model.safetensors"));
    let mut q8 = StoreWriter::create(q8_dir).unwrap();
    let mut deq = StoreWriter::create(deq_dir).unwrap();
    for (name, shape, values) in tensors {
        let spec = TensorSpec::new(&name, DType::F32, shape.clone());
        if is_projection(&name) {
            let (out, inp) = (shape[0], shape[1]);
            let written = write_q8(&mut q8, &name, &values, out, inp).unwrap();
            assert!(
                written.relative_error < 0.01,
                "{name}: {}",
                written.relative_error
            );
            let rows = quantize_rows(&values, out, inp).unwrap();
            let w = dequantize_rows(&rows.values, &rows.scales, out, inp).unwrap();
            deq.add(spec, &f32_bytes(&w)).unwrap();
        } else {
            q8.add(spec.clone(), &f32_bytes(&values)).unwrap();
            deq.add(spec, &f32_bytes(&values)).unwrap();
        }
    }
    q8.finish().unwrap();
    deq.finish().unwrap();
}

fn load(config: &Qwen2Config, dir: &Path, device: &Device) -> Qwen2ForCausalLM {
    let mut store = MappedStore::open(dir).unwrap();
    let mut model = config.try_init_for_store(device, store.manifest()).unwrap();
    model.load_from(&mut store).unwrap();
    model
}

fn tokens(ids: &[i64], device: &Device) -> Tensor<2, Int> {
    Tensor::from_data(TensorData::new(ids.to_vec(), [1, ids.len()]), device)
}

#[derive(Default)]
struct IntParams(Vec<(String, DType)>, Vec<String>);

impl ModuleVisitor for IntParams {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.1.push(name.to_string());
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.1.pop();
    }
    fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<D, Int>>) {
        self.0.push((self.1.join("."), param.val().dtype()));
    }
}

#[test]
fn q8_projections_load_by_their_paths_and_match_the_dequantized_float_model() {
    let device = Device::flex();
    for variant in ["untied", "tied"] {
        let dir = tempfile::tempdir().unwrap();
        let (q8_dir, deq_dir) = (dir.path().join("q8"), dir.path().join("deq"));
        write_stores(variant, &q8_dir, &deq_dir);
        let config = Qwen2Config::from_hf_json(fixture(variant).join("config.json")).unwrap();
        let q8 = load(&config, &q8_dir, &device);
        let float = load(&config, &deq_dir, &device);

        let layer = &q8.model.layers[0];
        for p in [
            &layer.self_attn.q_proj,
            &layer.self_attn.k_proj,
            &layer.self_attn.v_proj,
            &layer.self_attn.o_proj,
            &layer.mlp.gate_proj,
            &layer.mlp.up_proj,
            &layer.mlp.down_proj,
        ] {
            assert!(p.is_q8(), "{variant}");
        }
        assert!(!float.model.layers[0].self_attn.q_proj.is_q8());
        assert_eq!(
            q8.lm_head.as_ref().map(|h| h.is_q8()),
            (variant == "untied").then_some(true)
        );
        // Int parameters are the int8 weights at the HF paths, loaded as I8.
        let mut ints = IntParams::default();
        q8.visit(&mut ints);
        assert!(ints.0.iter().all(|(_, d)| *d == DType::I8));
        assert!(
            ints.0
                .iter()
                .any(|(p, _)| p == "model.layers.1.mlp.down_proj.weight")
        );

        // Prefill (T = prompt length) then single-token decode (T = 1).
        let prompt = [3i64, 17, 42, 8, 99, 5];
        let mut cq = q8.new_cache(1, 16);
        let mut cf = float.new_cache(1, 16);
        let lq = q8.forward(tokens(&prompt, &device), &mut cq).unwrap();
        let lf = float.forward(tokens(&prompt, &device), &mut cf).unwrap();
        let (lq, lf) = (
            lq.try_into_vec_as::<f32>().unwrap(),
            lf.try_into_vec_as::<f32>().unwrap(),
        );
        let vocab = config.vocab_size;
        for (pos, (a, b)) in lq.chunks(vocab).zip(lf.chunks(vocab)).enumerate() {
            let err = relative_error(a, b);
            assert!(err < 1e-4, "{variant} prefill {pos}: {err:e}");
        }
        let mut token = argmax(lq.chunks(vocab).last().unwrap()).unwrap() as i64;
        for step in 0..4 {
            let a = q8.forward_last(tokens(&[token], &device), &mut cq).unwrap();
            let b = float
                .forward_last(tokens(&[token], &device), &mut cf)
                .unwrap();
            let (a, b) = (
                a.try_into_vec_as::<f32>().unwrap(),
                b.try_into_vec_as::<f32>().unwrap(),
            );
            let err = relative_error(&a, &b);
            assert!(err < 1e-4, "{variant} decode {step}: {err:e}");
            token = argmax(&b).unwrap() as i64;
        }
    }
}

#[test]
fn the_float_init_is_unchanged_without_q8_tensors() {
    let config = Qwen2Config::from_hf_json(fixture("untied").join("config.json")).unwrap();
    let model = config.init(&Device::flex());
    assert!(!model.model.layers[1].mlp.up_proj.is_q8());
    assert!(!model.lm_head.unwrap().is_q8());
}

/// The device step (its own kernels, each token one recorded graph, the choice made on the
/// device) against the same q8 model on the host: the logits of the prompt's last position
/// within the 16-bit activation split's rounding, and the greedy tokens equal, recorded and
/// launched alike, and through `generate`.
#[cfg(feature = "gpu-tests")]
#[test]
fn the_device_step_decodes_the_q8_model_as_the_host_does() {
    use burn_mapped_models::qwen2::{DeviceDecoder, Sampler, Sampling};
    let Some(gpu) = burn_mapped_tests::gpu::wgpu_device() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (q8_dir, deq_dir) = (dir.path().join("q8"), dir.path().join("deq"));
    write_stores("untied", &q8_dir, &deq_dir);
    let config = Qwen2Config::from_hf_json(fixture("untied").join("config.json")).unwrap();
    let host = load(&config, &q8_dir, &Device::flex());
    let device = load(&config, &q8_dir, &gpu);

    let prompt = [3u32, 141, 59, 26, 53, 58, 97];
    const NEW: usize = 9;
    let expected = host
        .generate(&prompt, NEW, &mut Sampler::greedy(), &[])
        .unwrap();
    let ids: Vec<i64> = prompt.iter().map(|&t| i64::from(t)).collect();
    let mut cache = host.new_cache(1, prompt.len());
    let want = host
        .forward_last(tokens(&ids, &Device::flex()), &mut cache)
        .unwrap()
        .try_into_vec_as::<f32>()
        .unwrap();

    // The prompt in one prefill pass, and in passes of 3, 3 and 1 positions.
    for rows in [512, 3] {
        let mut first = DeviceDecoder::new(&device, prompt.len() + NEW)
            .expect("takes the q8 model")
            .with_prefill_rows(rows);
        assert_eq!(
            first
                .generate(&prompt, 1, &mut Sampler::greedy(), &[], |_| {})
                .unwrap(),
            expected[..1]
        );
        let err = relative_error(&first.logits().unwrap(), &want);
        // Activations enter each product as 16-bit integers per block of 16 (~2^-15 of the
        // block's largest value): a few 1e-5 across the layers; a wrong kernel is off by O(1).
        assert!(
            err < 2e-4,
            "logits at the prompt's end, passes of {rows}: relative error {err:e}"
        );
    }

    for (record, rows) in [(true, 512), (false, 512), (true, 2)] {
        let decoder = DeviceDecoder::new(&device, prompt.len() + NEW)
            .unwrap()
            .with_prefill_rows(rows);
        let mut decoder = if record {
            decoder
        } else {
            decoder.without_capture()
        };
        let mut seen = Vec::new();
        let got = decoder
            .generate(&prompt, NEW, &mut Sampler::greedy(), &[], |t| seen.push(t))
            .unwrap();
        assert_eq!(got, expected, "recorded: {record}, passes of {rows}");
        assert_eq!(seen, expected);
        // wgpu records graphs: the recorded path is the one under test here.
        assert_eq!(decoder.is_recorded(), record);
        // Per layer 5, plus the lookup, the final norm, the head and the choice's two passes.
        assert_eq!(
            decoder.launches_per_token(),
            1 + 5 * config.num_hidden_layers + 4
        );
        // The logits a fresh decoder ends a `tokens`-token generation with.
        let ending = |tokens: usize| {
            let mut fresh = DeviceDecoder::new(&device, prompt.len() + NEW)
                .unwrap()
                .with_prefill_rows(rows);
            fresh
                .generate(&prompt, tokens, &mut Sampler::greedy(), &[], |_| {})
                .unwrap();
            fresh.logits().unwrap()
        };
        // Timing steps runs them again from the first: two leave the logits a three-token
        // generation ends with (lavapipe has no device timer, but the steps run).
        let timed = decoder.device_time_per_step(2).unwrap();
        assert!(timed.is_none_or(|t| !t.is_zero()));
        assert_eq!(
            decoder.logits().unwrap(),
            ending(3),
            "steps timed again, recorded: {record}"
        );
        // Timing each launch runs the first step again, launch by launch: it leaves the logits
        // a two-token generation ends with.
        let kinds = decoder.device_time_by_launch().unwrap();
        assert!(kinds.is_none_or(|k| k.iter().any(|(kind, _)| *kind == "attention")));
        assert_eq!(
            decoder.logits().unwrap(),
            ending(2),
            "first step timed by launch, recorded: {record}"
        );
        // Timing the prompt runs its passes again: it leaves the logits at the prompt's end,
        // those of a one-token generation.
        let timed = decoder.prompt_device_time().unwrap();
        assert!(timed.is_none_or(|t| !t.is_zero()));
        assert_eq!(
            decoder.logits().unwrap(),
            ending(1),
            "prompt timed, recorded: {record}"
        );
    }
    // A cache longer than one attention pass: each head's positions spread over cubes and then
    // combined (a sixth launch a layer), the prompt reaching past the first cube's range.
    let long: Vec<u32> = (0..200u32).map(|i| (i * 37 + 11) % 256).collect();
    let want_long = host
        .generate(&long, NEW, &mut Sampler::greedy(), &[])
        .unwrap();
    let mut decoder = DeviceDecoder::new(&device, 300).unwrap();
    let got = decoder
        .generate(&long, NEW, &mut Sampler::greedy(), &[], |_| {})
        .unwrap();
    assert_eq!(got, want_long, "a cache of 300 positions");
    assert!(decoder.is_recorded());
    assert_eq!(
        decoder.launches_per_token(),
        1 + 6 * config.num_hidden_layers + 4
    );

    // `generate` takes the step by default, and stops after a stop token.
    let stop = expected[3];
    let got = device
        .generate(&prompt, NEW, &mut Sampler::greedy(), &[stop])
        .unwrap();
    assert_eq!(got, expected[..4]);

    // Top-p on the device: one seed, the host's tokens (the draws are the host sampler's, the
    // nucleus walked in the same order), and the sampler's stream left where the host's is.
    for (seed, temperature, top_p) in [(1, 1.0, 0.9), (2, 0.7, 0.5), (3, 1.5, 1.0)] {
        let rule = Sampling::TopP {
            temperature,
            top_p,
            seed,
        };
        let mut on_host = Sampler::new(rule).unwrap();
        let mut on_device = Sampler::new(rule).unwrap();
        let want = host.generate(&prompt, NEW, &mut on_host, &[]).unwrap();
        let mut decoder = DeviceDecoder::new(&device, prompt.len() + NEW).unwrap();
        let got = decoder
            .generate(&prompt, NEW, &mut on_device, &[], |_| {})
            .unwrap();
        assert_eq!(got, want, "top-p, seed {seed}");
        assert!(decoder.is_recorded());
        let row: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
        let next =
            |s: &mut Sampler| -> Vec<u32> { (0..8).map(|_| s.sample(&row).unwrap()).collect() };
        assert_eq!(
            next(&mut on_device),
            next(&mut on_host),
            "the stream after top-p, seed {seed}"
        );
    }
}

/// A random q8 Qwen2 store of `config`'s shapes: projections q8, everything else f32, values
/// small enough that activations stay finite (for the GPU test of wide shapes).
#[cfg(feature = "gpu-tests")]
fn write_random_store(config: &Qwen2Config, dir: &Path) {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut values = |n: usize, scale: f32| -> Vec<f32> {
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale
            })
            .collect()
    };
    let (h, i, v) = (
        config.hidden_size,
        config.intermediate_size,
        config.vocab_size,
    );
    let kv = config.num_key_value_heads * config.head_dim;
    let mut w = StoreWriter::create(dir).unwrap();
    let float = |w: &mut StoreWriter, name: &str, shape: Vec<usize>, v: Vec<f32>| {
        w.add(TensorSpec::new(name, DType::F32, shape), &f32_bytes(&v))
            .unwrap();
    };
    float(
        &mut w,
        "model.embed_tokens.weight",
        vec![v, h],
        values(v * h, 2.0),
    );
    float(&mut w, "model.norm.weight", vec![h], vec![1.0; h]);
    write_q8(&mut w, "lm_head.weight", &values(v * h, 0.2), v, h).unwrap();
    for l in 0..config.num_hidden_layers {
        let p = |s: &str| format!("model.layers.{l}.{s}");
        float(&mut w, &p("input_layernorm.weight"), vec![h], vec![1.0; h]);
        float(
            &mut w,
            &p("post_attention_layernorm.weight"),
            vec![h],
            vec![1.0; h],
        );
        for (name, out, inp) in [
            ("self_attn.q_proj", h, h),
            ("self_attn.k_proj", kv, h),
            ("self_attn.v_proj", kv, h),
            ("self_attn.o_proj", h, h),
            ("mlp.gate_proj", i, h),
            ("mlp.up_proj", i, h),
            ("mlp.down_proj", h, i),
        ] {
            let scale = 2.0 / (inp as f32).sqrt();
            write_q8(
                &mut w,
                &p(&format!("{name}.weight")),
                &values(out * inp, scale),
                out,
                inp,
            )
            .unwrap();
            if name.ends_with("q_proj") || name.ends_with("k_proj") || name.ends_with("v_proj") {
                float(
                    &mut w,
                    &p(&format!("{name}.bias")),
                    vec![out],
                    values(out, 0.1),
                );
            }
        }
    }
    w.finish().unwrap();
}

/// The device step takes Qwen2's wider shapes, with widths sized by the adapter's own shared
/// memory rather than a constant: Qwen2.5-1.5B's 8960-wide MLP, and one layer of the 7B shape
/// (hidden 3584, 28 heads of 128 over 4 key/value heads, MLP 18944). It decodes as the host
/// does; where the adapter's limit is too small for a width it says so, and a model it does not
/// take is refused with the reason.
#[cfg(feature = "gpu-tests")]
#[test]
fn the_device_step_takes_wide_shapes_or_says_why_not() {
    use burn_mapped_models::qwen2::{DeviceDecoder, Sampler};
    let Some(gpu) = burn_mapped_tests::gpu::wgpu_device() else {
        return;
    };
    let small = Qwen2Config {
        vocab_size: 256,
        hidden_size: 128,
        intermediate_size: 8960,
        num_hidden_layers: 2,
        num_attention_heads: 2,
        num_key_value_heads: 1,
        head_dim: 64,
        rms_norm_eps: 1e-6,
        rope_theta: 10000.0,
        max_position_embeddings: 64,
        tie_word_embeddings: false,
    };
    let seven_b = Qwen2Config {
        hidden_size: 3584,
        intermediate_size: 18944,
        num_hidden_layers: 1,
        num_attention_heads: 28,
        num_key_value_heads: 4,
        head_dim: 128,
        ..small.clone()
    };
    let mut host = None;
    for config in [small, seven_b] {
        let dir = tempfile::tempdir().unwrap();
        write_random_store(&config, dir.path());
        let on_host = load(&config, dir.path(), &Device::flex());
        let device = load(&config, dir.path(), &gpu);
        let prompt = [3u32, 141, 59, 26];
        const NEW: usize = 6;
        match DeviceDecoder::try_new(&device, prompt.len() + NEW) {
            Ok(mut decoder) => {
                let want = on_host
                    .generate(&prompt, NEW, &mut Sampler::greedy(), &[])
                    .unwrap();
                let got = decoder
                    .generate(&prompt, NEW, &mut Sampler::greedy(), &[], |_| {})
                    .unwrap();
                assert_eq!(got, want, "hidden {}", config.hidden_size);
                // Memory by purpose, from the configuration: the cache is every layer's keys
                // and values in f32; the weights hold at least every projection's int8 values
                // and f16 row scales.
                let c = &config;
                let bytes = decoder.device_bytes();
                let capacity = prompt.len() + NEW;
                let kv = c.num_key_value_heads * c.head_dim;
                assert_eq!(
                    bytes.cache,
                    (c.num_hidden_layers * 2 * kv * capacity * 4) as u64
                );
                let q8 = |out: usize, inp: usize| (out * inp + 2 * out) as u64;
                let (h, i) = (c.hidden_size, c.intermediate_size);
                let projections = 2 * q8(h, h) + 2 * q8(kv, h) + 2 * q8(i, h) + q8(h, i);
                assert!(
                    bytes.weights >= c.num_hidden_layers as u64 * projections,
                    "{bytes:?}"
                );
                assert!(bytes.scratch > 0, "{bytes:?}");
            }
            Err(refused) => {
                // Only an adapter with less shared memory than the split needs may refuse.
                assert!(refused.0.contains("shared memory"), "{refused}");
                eprintln!("note: hidden {}: {refused}", config.hidden_size);
            }
        }
        host = Some(on_host);
    }
    // A model on the host is refused, naming what the step needs.
    let refused = DeviceDecoder::try_new(host.as_ref().unwrap(), 8)
        .err()
        .expect("refused");
    assert!(refused.0.contains("CubeCL"), "{refused}");
}
