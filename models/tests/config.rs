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
fn rejects_a_missing_size() {
    let err = Qwen2Config::from_hf_str(&without("hidden_size")).unwrap_err();
    assert!(
        matches!(
            err,
            ConfigError::MissingField {
                field: "hidden_size"
            }
        ),
        "{err}"
    );
}

#[test]
fn absent_key_value_heads_means_multi_head_attention() {
    let c = Qwen2Config::from_hf_str(&without("num_key_value_heads")).unwrap();
    assert_eq!(c.num_key_value_heads, 14);
}

#[test]
fn rejects_key_value_heads_that_do_not_divide_heads() {
    let err = Qwen2Config::from_hf_str(&with("num_key_value_heads", "3")).unwrap_err();
    assert!(
        matches!(
            err,
            ConfigError::Invalid {
                field: "num_key_value_heads",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn rejects_heads_that_do_not_divide_hidden_size() {
    let err = Qwen2Config::from_hf_str(&with("num_attention_heads", "12")).unwrap_err();
    assert!(
        matches!(
            err,
            ConfigError::Invalid {
                field: "head_dim",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn rejects_zero_heads() {
    let err = Qwen2Config::from_hf_str(&with("num_attention_heads", "0")).unwrap_err();
    assert!(matches!(err, ConfigError::Invalid { .. }), "{err}");
}

#[test]
fn rejects_sliding_window_attention() {
    let err = Qwen2Config::from_hf_str(&with("use_sliding_window", "true")).unwrap_err();
    assert!(
        matches!(
            err,
            ConfigError::Unsupported {
                field: "use_sliding_window",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn rejects_yarn_rope_scaling() {
    let scaling = r#"{"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}"#;
    let err = Qwen2Config::from_hf_str(&with("rope_scaling", scaling)).unwrap_err();
    assert!(
        matches!(
            err,
            ConfigError::Unsupported {
                field: "rope_scaling",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn accepts_null_rope_scaling() {
    assert!(Qwen2Config::from_hf_str(&with("rope_scaling", "null")).is_ok());
}

#[test]
fn rejects_another_model_type() {
    let err = Qwen2Config::from_hf_str(&with("model_type", "\"qwen3\"")).unwrap_err();
    assert!(
        matches!(
            err,
            ConfigError::Unsupported {
                field: "model_type",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn rejects_another_activation() {
    let err = Qwen2Config::from_hf_str(&with("hidden_act", "\"gelu\"")).unwrap_err();
    assert!(
        matches!(
            err,
            ConfigError::Unsupported {
                field: "hidden_act",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn rejects_a_non_positive_epsilon() {
    let err = Qwen2Config::from_hf_str(&with("rms_norm_eps", "0.0")).unwrap_err();
    assert!(
        matches!(
            err,
            ConfigError::Invalid {
                field: "rms_norm_eps",
                ..
            }
        ),
        "{err}"
    );
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
