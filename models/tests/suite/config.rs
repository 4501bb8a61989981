//! Reading Hugging Face `config.json` files.

use burn_mapped_models::qwen2::{ConfigError, Qwen2Config};
use burn_mapped_tests::tiny_qwen2::fixture;

#[test]
fn reads_a_transformers_5_config_with_rope_parameters() {
    let c = Qwen2Config::from_hf_json(fixture("untied").join("config.json")).unwrap();
    assert_eq!(
        c,
        Qwen2Config {
            vocab_size: 256,
            hidden_size: 64,
            intermediate_size: 128,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 16,
            rms_norm_eps: 1e-6,
            rope_theta: 10_000.0,
            max_position_embeddings: 128,
            tie_word_embeddings: false,
        }
    );
    let tied = Qwen2Config::from_hf_json(fixture("tied").join("config.json")).unwrap();
    assert!(tied.tie_word_embeddings);
}

/// The layout of the published Qwen2.5-0.5B-Instruct config (transformers 4.x keys).
const QWEN25_05B: &str = r#"{
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "max_window_layers": 21,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.1",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
}"#;

#[test]
fn reads_a_transformers_4_config_with_rope_theta() {
    let c = Qwen2Config::from_hf_str(QWEN25_05B).unwrap();
    assert_eq!(c.head_dim, 64);
    assert_eq!(c.rope_theta, 1e6);
    assert_eq!(c.num_key_value_heads, 2);
    assert_eq!(c.vocab_size, 151_936);
    assert!(c.tie_word_embeddings);
}

fn with(key: &str, value: &str) -> String {
    let mut v: serde_json::Value = serde_json::from_str(QWEN25_05B).unwrap();
    v[key] = serde_json::from_str(value).unwrap();
    v.to_string()
}

fn without(key: &str) -> String {
    let mut v: serde_json::Value = serde_json::from_str(QWEN25_05B).unwrap();
    v.as_object_mut().unwrap().remove(key);
    v.to_string()
}

#[test]
fn absent_key_value_heads_means_multi_head_attention() {
    let c = Qwen2Config::from_hf_str(&without("num_key_value_heads")).unwrap();
    assert_eq!(c.num_key_value_heads, 14);
}

#[test]
fn accepts_null_rope_scaling() {
    assert!(Qwen2Config::from_hf_str(&with("rope_scaling", "null")).is_ok());
}

/// A refusal's kind and the field it names.
fn refusal(err: &ConfigError) -> (&'static str, &'static str) {
    match err {
        ConfigError::MissingField { field } => ("missing", field),
        ConfigError::Invalid { field, .. } => ("invalid", field),
        ConfigError::Unsupported { field, .. } => ("unsupported", field),
        other => panic!("not a refusal of a field: {other}"),
    }
}

/// Each edit of the published config that must be refused: the key, its new value (`None`:
/// removed), the kind of refusal and the field it must name (`None`: any field).
#[test]
fn rejects_what_it_cannot_run_naming_the_field() {
    let yarn = r#"{"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}"#;
    let cases = [
        ("hidden_size", None, "missing", Some("hidden_size")),
        // Key-value heads that do not divide the heads.
        (
            "num_key_value_heads",
            Some("3"),
            "invalid",
            Some("num_key_value_heads"),
        ),
        // Heads that do not divide the hidden size.
        (
            "num_attention_heads",
            Some("12"),
            "invalid",
            Some("head_dim"),
        ),
        ("num_attention_heads", Some("0"), "invalid", None),
        (
            "use_sliding_window",
            Some("true"),
            "unsupported",
            Some("use_sliding_window"),
        ),
        (
            "rope_scaling",
            Some(yarn),
            "unsupported",
            Some("rope_scaling"),
        ),
        (
            "model_type",
            Some("\"qwen3\""),
            "unsupported",
            Some("model_type"),
        ),
        (
            "hidden_act",
            Some("\"gelu\""),
            "unsupported",
            Some("hidden_act"),
        ),
        ("rms_norm_eps", Some("0.0"), "invalid", Some("rms_norm_eps")),
    ];
    for (key, value, kind, field) in cases {
        let json = value.map_or_else(|| without(key), |value| with(key, value));
        let err = Qwen2Config::from_hf_str(&json).unwrap_err();
        let (got_kind, got_field) = refusal(&err);
        assert_eq!(got_kind, kind, "{key}: {err}");
        if let Some(field) = field {
            assert_eq!(got_field, field, "{key}: {err}");
        }
    }
}

#[test]
fn rejects_malformed_json_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(&path, "{ \"hidden_size\": ").unwrap();
    match Qwen2Config::from_hf_json(&path).unwrap_err() {
        ConfigError::Json { path: p, .. } => assert_eq!(p, path),
        other => panic!("{other}"),
    }
}

#[test]
fn rejects_a_missing_file_keeping_the_io_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.json");
    match Qwen2Config::from_hf_json(&path).unwrap_err() {
        ConfigError::Io { path: p, source } => {
            assert_eq!(p, path);
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("{other}"),
    }
}

#[test]
fn try_init_refuses_an_invalid_hand_built_config() {
    let mut c = Qwen2Config::from_hf_str(QWEN25_05B).unwrap();
    c.head_dim = 63;
    assert!(matches!(
        c.try_init(&burn::tensor::Device::flex()),
        Err(ConfigError::Invalid {
            field: "head_dim",
            ..
        })
    ));
}
