//! Burn module paths must be the Hugging Face tensor names, with HF shapes, so a
//! safetensors file written by transformers loads with no remapping.

use crate::common;

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::Tensor;
use burn_mapped_models::qwen2::Qwen2Config;
use burn_mapped_tests::tiny_qwen2::fixture;
use common::safetensors_shapes;

/// Collects every float parameter's path and stored shape without initializing it.
#[derive(Default)]
struct Paths {
    stack: Vec<String>,
    params: Vec<(String, Vec<usize>)>,
    initialized: Vec<String>,
}

impl ModuleVisitor for Paths {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.stack.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.stack.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let path = self.stack.join(".");
        if param.is_initialized() {
            self.initialized.push(path.clone());
        }
        self.params.push((path, param.lazy_shape().to_vec()));
    }
}

fn paths_of(variant: &str) -> Paths {
    let config = Qwen2Config::from_hf_json(fixture(variant).join("config.json")).unwrap();
    let model = config.init(&burn::tensor::Device::flex());
    let mut paths = Paths::default();
    model.visit(&mut paths);
    paths.params.sort();
    paths
}

#[test]
fn module_paths_and_shapes_equal_the_transformers_tensors() {
    for variant in ["untied", "tied"] {
        let ours = paths_of(variant).params;
        let hf = safetensors_shapes(&fixture(variant).join("model.safetensors"));
        assert_eq!(ours, hf, "{variant}");
    }
}

#[test]
fn paths_include_the_expected_names() {
    let params = paths_of("untied").params;
    let names: Vec<&str> = params.iter().map(|(p, _)| p.as_str()).collect();
    for expected in [
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.q_proj.bias",
        "model.layers.1.self_attn.o_proj.weight",
        "model.layers.1.mlp.down_proj.weight",
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.post_attention_layernorm.weight",
        "model.norm.weight",
        "lm_head.weight",
    ] {
        assert!(
            names.contains(&expected),
            "{expected} missing from {names:?}"
        );
    }
    assert!(!names.iter().any(|n| n.contains("o_proj.bias")));
    let q = params
        .iter()
        .find(|(p, _)| p == "model.layers.0.self_attn.k_proj.weight")
        .unwrap();
    // [out, in] = [kv_heads * head_dim, hidden], as HF stores it.
    assert_eq!(q.1, vec![32, 64]);
}

#[test]
fn init_runs_no_initializer() {
    let paths = paths_of("untied");
    assert!(!paths.params.is_empty());
    assert!(
        paths.initialized.is_empty(),
        "initialized before loading: {:?}",
        paths.initialized
    );
}

#[test]
fn the_record_of_a_model_has_one_entry_per_hf_tensor() {
    for variant in ["untied", "tied"] {
        let config = Qwen2Config::from_hf_json(fixture(variant).join("config.json")).unwrap();
        let record = config.init(&burn::tensor::Device::flex()).into_record();
        let hf = safetensors_shapes(&fixture(variant).join("model.safetensors"));
        assert_eq!(record.len(), hf.len(), "{variant}");
    }
}
