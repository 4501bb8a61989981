//! GGUF's Qwen2 tensor names and metadata, mapped onto this crate's module paths (which are the
//! Hugging Face names) and [`Qwen2Config`].

use super::config::{ConfigError, Qwen2Config};

/// Per-layer renames, GGUF suffix to Hugging Face suffix.
const LAYER_RENAMES: &[(&str, &str)] = &[
    ("attn_norm.weight", "input_layernorm.weight"),
    ("ffn_norm.weight", "post_attention_layernorm.weight"),
    ("attn_q.weight", "self_attn.q_proj.weight"),
    ("attn_q.bias", "self_attn.q_proj.bias"),
    ("attn_k.weight", "self_attn.k_proj.weight"),
    ("attn_k.bias", "self_attn.k_proj.bias"),
    ("attn_v.weight", "self_attn.v_proj.weight"),
    ("attn_v.bias", "self_attn.v_proj.bias"),
    ("attn_output.weight", "self_attn.o_proj.weight"),
    ("ffn_gate.weight", "mlp.gate_proj.weight"),
    ("ffn_up.weight", "mlp.up_proj.weight"),
    ("ffn_down.weight", "mlp.down_proj.weight"),
];

/// Whole-model renames.
const GLOBAL_RENAMES: &[(&str, &str)] = &[
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
];

/// The module path of GGUF tensor `name`, or `None` for tensors the model does not use.
pub fn hf_name(name: &str) -> Option<String> {
    if let Some((_, hf)) = GLOBAL_RENAMES.iter().find(|(g, _)| *g == name) {
        return Some(hf.to_string());
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, suffix) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (_, hf) = LAYER_RENAMES.iter().find(|(g, _)| *g == suffix)?;
    Some(format!("model.layers.{layer}.{hf}"))
}

/// Builds the configuration from GGUF metadata, read through `get` (a GGUF file's scalar
/// values, or a store manifest's `gguf.*` strings), plus the two facts GGUF states through its
/// tensors: the vocabulary size (rows of `token_embd.weight`) and whether `output.weight`
/// exists.
pub fn config_from_gguf(
    get: impl Fn(&str) -> Option<String>,
    vocab_size: usize,
    has_output_weight: bool,
) -> Result<Qwen2Config, ConfigError> {
    fn parse<T: std::str::FromStr>(
        get: &impl Fn(&str) -> Option<String>,
        key: &'static str,
    ) -> Result<T, ConfigError> {
        let text = get(key).ok_or(ConfigError::MissingField { field: key })?;
        text.parse().map_err(|_| ConfigError::Invalid {
            field: key,
            value: text,
            reason: "not a number",
        })
    }
    let hidden_size: usize = parse(&get, "qwen2.embedding_length")?;
    let num_attention_heads: usize = parse(&get, "qwen2.attention.head_count")?;
    if num_attention_heads == 0 {
        return Err(ConfigError::Invalid {
            field: "qwen2.attention.head_count",
            value: "0".into(),
            reason: "must be positive",
        });
    }
    let config = Qwen2Config {
        vocab_size,
        hidden_size,
        intermediate_size: parse(&get, "qwen2.feed_forward_length")?,
        num_hidden_layers: parse(&get, "qwen2.block_count")?,
        num_attention_heads,
        num_key_value_heads: parse(&get, "qwen2.attention.head_count_kv")?,
        head_dim: hidden_size / num_attention_heads,
        rms_norm_eps: parse(&get, "qwen2.attention.layer_norm_rms_epsilon")?,
        rope_theta: parse(&get, "qwen2.rope.freq_base")?,
        max_position_embeddings: parse(&get, "qwen2.context_length")?,
        tie_word_embeddings: !has_output_weight,
    };
    config.validate()?;
    Ok(config)
}

/// The configuration recorded in a store converted from GGUF: its `gguf.*` metadata, the
/// rows of `model.embed_tokens.weight` and whether it holds a separate `lm_head.weight`.
pub fn config_from_manifest(manifest: &burn_mapped::Manifest) -> Result<Qwen2Config, ConfigError> {
    let vocab = manifest
        .get("model.embed_tokens.weight")
        .and_then(|t| t.shape().first().copied())
        .ok_or(ConfigError::MissingField {
            field: "model.embed_tokens.weight",
        })?;
    let meta = manifest.metadata();
    let config = config_from_gguf(
        |key| meta.get(&format!("gguf.{key}")).cloned(),
        vocab,
        manifest.get("lm_head.weight").is_some(),
    )?;
    check_layers(
        &config,
        manifest.tensors().iter().map(|t| t.name()),
        "model.layers.",
    )?;
    Ok(config)
}

/// Checks that the weights, named `names`, hold exactly the configuration's layers (the
/// metadata's block count is a claim; a file that claims 10^8 layers and holds 24 is refused
/// before anything is sized by the claim).
///
/// # Errors
/// [`ConfigError::Disagrees`] when the highest layer index among the names is not the count
/// minus one.
pub(crate) fn check_layers<'a>(
    config: &Qwen2Config,
    names: impl IntoIterator<Item = &'a str>,
    prefix: &str,
) -> Result<(), ConfigError> {
    let found = names
        .into_iter()
        .filter_map(|name| {
            name.strip_prefix(prefix)?
                .split('.')
                .next()?
                .parse::<usize>()
                .ok()
        })
        .max()
        .map_or(0, |i| i + 1);
    if found != config.num_hidden_layers {
        return Err(ConfigError::Disagrees {
            field: "num_hidden_layers",
            value: config.num_hidden_layers,
            found,
            what: "decoder layers",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_every_qwen2_tensor_kind() {
        assert_eq!(
            hf_name("token_embd.weight").unwrap(),
            "model.embed_tokens.weight"
        );
        assert_eq!(hf_name("output.weight").unwrap(), "lm_head.weight");
        assert_eq!(
            hf_name("blk.23.attn_k.bias").unwrap(),
            "model.layers.23.self_attn.k_proj.bias"
        );
        assert_eq!(
            hf_name("blk.0.ffn_down.weight").unwrap(),
            "model.layers.0.mlp.down_proj.weight"
        );
        assert_eq!(hf_name("blk.x.ffn_down.weight"), None);
        assert_eq!(hf_name("rope_freqs.weight"), None);
    }
}
