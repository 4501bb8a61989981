//! GGUF files written byte by byte: a [`Builder`] that writes exactly what a test says, valid
//! or not, and [`tiny_qwen2`], a small valid Qwen2 checkpoint (random f32 weights and a
//! byte-level vocabulary) for tests that need a whole model without the real one.

use burn_mapped::gguf::GgufFile;
use serde_json::Value as Json;

use crate::json::u64s;
use crate::synthetic::pattern;

/// GGUF value type ids.
pub const T_U8: u32 = 0;
/// `u32`.
pub const T_U32: u32 = 4;
/// `i32`.
pub const T_I32: u32 = 5;
/// `f32`.
pub const T_F32: u32 = 6;
/// `bool`.
pub const T_BOOL: u32 = 7;
/// `string`.
pub const T_STRING: u32 = 8;
/// `array`.
pub const T_ARRAY: u32 = 9;
/// `u64`.
pub const T_U64: u32 = 10;

/// ggml tensor type ids.
pub const F32: u32 = 0;
/// `f16`.
pub const F16: u32 = 1;
/// `q8_0`.
pub const Q8_0: u32 = 8;

/// `v` little-endian.
pub fn le32(v: u32) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

/// `v` little-endian.
pub fn le64(v: u64) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

/// A GGUF string: u64 length, then the bytes.
pub fn gstr(s: &[u8]) -> Vec<u8> {
    [le64(s.len() as u64), s.to_vec()].concat()
}

/// A GGUF array of strings.
pub fn gstr_array<S: AsRef<str>>(items: &[S]) -> Vec<u8> {
    let mut out = le32(T_STRING);
    out.extend(le64(items.len() as u64));
    for s in items {
        out.extend(gstr(s.as_ref().as_bytes()));
    }
    out
}

/// A GGUF array of `i32`.
pub fn gi32_array(items: &[i32]) -> Vec<u8> {
    let mut out = le32(T_I32);
    out.extend(le64(items.len() as u64));
    for v in items {
        out.extend(v.to_le_bytes());
    }
    out
}

/// A GGUF file, field by field; nothing is checked.
#[derive(Clone, Debug)]
pub struct Builder {
    /// The first four bytes.
    pub magic: [u8; 4],
    /// The version field.
    pub version: u32,
    /// The metadata count written, if not the entries' number.
    pub n_kv: Option<u64>,
    /// The tensor count written, if not the entries' number.
    pub n_tensors: Option<u64>,
    kv: Vec<Vec<u8>>,
    infos: Vec<Vec<u8>>,
    /// The data section's alignment (padding after the header).
    pub align: u64,
    data: Vec<u8>,
}

impl Default for Builder {
    fn default() -> Self {
        Self::new()
    }
}

impl Builder {
    /// An empty version 3 file.
    pub fn new() -> Self {
        Builder {
            magic: *b"GGUF",
            version: 3,
            n_kv: None,
            n_tensors: None,
            kv: Vec::new(),
            infos: Vec::new(),
            align: 32,
            data: Vec::new(),
        }
    }

    /// A metadata entry with an already-encoded value.
    pub fn kv(mut self, key: &str, type_id: u32, value: Vec<u8>) -> Self {
        self.kv
            .push([gstr(key.as_bytes()), le32(type_id), value].concat());
        self
    }

    /// A `u32` entry.
    pub fn kv_u32(self, key: &str, v: u32) -> Self {
        self.kv(key, T_U32, le32(v))
    }

    /// A `u64` entry.
    pub fn kv_u64(self, key: &str, v: u64) -> Self {
        self.kv(key, T_U64, le64(v))
    }

    /// An `f32` entry.
    pub fn kv_f32(self, key: &str, v: f32) -> Self {
        self.kv(key, T_F32, v.to_le_bytes().to_vec())
    }

    /// A string entry.
    pub fn kv_str(self, key: &str, s: &str) -> Self {
        self.kv(key, T_STRING, gstr(s.as_bytes()))
    }

    /// A tensor-table entry; `offset` is relative to the data section.
    pub fn tensor(mut self, name: &str, dims: &[u64], type_id: u32, offset: u64) -> Self {
        let mut b = gstr(name.as_bytes());
        b.extend(le32(dims.len() as u32));
        for &d in dims {
            b.extend(le64(d));
        }
        b.extend(le32(type_id));
        b.extend(le64(offset));
        self.infos.push(b);
        self
    }

    /// The data section.
    pub fn data(mut self, data: Vec<u8>) -> Self {
        self.data = data;
        self
    }

    /// Appends `bytes` to the data section at the next multiple of the alignment, and adds
    /// the tensor-table entry for them.
    pub fn tensor_data(mut self, name: &str, dims: &[u64], type_id: u32, bytes: &[u8]) -> Self {
        while !(self.data.len() as u64).is_multiple_of(self.align) {
            self.data.push(0);
        }
        let offset = self.data.len() as u64;
        self.data.extend_from_slice(bytes);
        self.tensor(name, dims, type_id, offset)
    }

    /// Header, metadata and tensor table only, with no padding or data.
    pub fn header_bytes(&self) -> Vec<u8> {
        let mut out = self.magic.to_vec();
        out.extend(le32(self.version));
        out.extend(le64(self.n_tensors.unwrap_or(self.infos.len() as u64)));
        out.extend(le64(self.n_kv.unwrap_or(self.kv.len() as u64)));
        out.extend(self.kv.concat());
        out.extend(self.infos.concat());
        out
    }

    /// The whole file.
    pub fn build(&self) -> Vec<u8> {
        let mut out = self.header_bytes();
        while !(out.len() as u64).is_multiple_of(self.align) {
            out.push(0);
        }
        out.extend(&self.data);
        out
    }
}

/// GPT-2's byte-level spelling: the character each byte is written as in a vocabulary.
pub fn byte_spelling(b: u8) -> char {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(b) {
        return char::from(b);
    }
    let shift = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + shift).expect("below 512")
}

/// Dimensions of [`tiny_qwen2`].
#[derive(Debug, Clone, Copy)]
pub struct TinyDims {
    /// Decoder layers the metadata claims.
    pub layers_claimed: u64,
    /// Decoder layers the file holds.
    pub layers: u64,
    /// Hidden width.
    pub hidden: u64,
    /// MLP width.
    pub inter: u64,
    /// Attention heads.
    pub heads: u32,
    /// Key/value heads.
    pub kv_heads: u32,
    /// Context the metadata claims.
    pub context: u64,
}

impl Default for TinyDims {
    fn default() -> Self {
        Self {
            layers_claimed: 2,
            layers: 2,
            hidden: 32,
            inter: 64,
            heads: 4,
            kv_heads: 2,
            context: 128,
        }
    }
}

/// Special tokens after the 256 byte tokens: end of text, chat start, chat end.
pub const TINY_SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// A small valid Qwen2 GGUF: f32 weights from `seed` (scaled small, so logits stay finite),
/// a vocabulary of the 256 byte tokens plus [`TINY_SPECIALS`] (end of turn: `<|im_end|>`),
/// no merges, a separate output head.
pub fn tiny_qwen2(dims: TinyDims, seed: u64) -> Builder {
    let vocab = 256 + TINY_SPECIALS.len() as u64;
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_spelling(b).to_string()).collect();
    tokens.extend(TINY_SPECIALS.iter().map(|s| s.to_string()));
    let mut types = vec![1i32; 256];
    types.extend([3, 3, 3]);
    let mut b = Builder::new()
        .kv_str("general.architecture", "qwen2")
        .kv_str("general.name", "tiny")
        .kv_u64("qwen2.block_count", dims.layers_claimed)
        .kv_u64("qwen2.context_length", dims.context)
        .kv_u64("qwen2.embedding_length", dims.hidden)
        .kv_u64("qwen2.feed_forward_length", dims.inter)
        .kv_u32("qwen2.attention.head_count", dims.heads)
        .kv_u32("qwen2.attention.head_count_kv", dims.kv_heads)
        .kv_f32("qwen2.rope.freq_base", 10000.0)
        .kv_f32("qwen2.attention.layer_norm_rms_epsilon", 1e-6)
        .kv_str("tokenizer.ggml.model", "gpt2")
        .kv("tokenizer.ggml.tokens", T_ARRAY, gstr_array(&tokens))
        .kv("tokenizer.ggml.merges", T_ARRAY, gstr_array::<&str>(&[]))
        .kv("tokenizer.ggml.token_type", T_ARRAY, gi32_array(&types))
        .kv_u32("tokenizer.ggml.eos_token_id", 258)
        .kv_u32("tokenizer.ggml.bos_token_id", 256);
    let mut n = 0u64;
    let mut weights = |b: Builder, name: &str, dims: &[u64]| {
        n += 1;
        let count: u64 = dims.iter().product();
        // Bytes of a pattern read as small floats in [-0.1, 0.1).
        let values: Vec<u8> = pattern(count as usize, seed.wrapping_mul(1000) + n)
            .iter()
            .flat_map(|&x| ((f32::from(x) - 128.0) / 1280.0).to_le_bytes())
            .collect();
        b.tensor_data(name, dims, F32, &values)
    };
    let ones = |b: Builder, name: &str, width: u64| {
        let values: Vec<u8> = (0..width).flat_map(|_| 1.0f32.to_le_bytes()).collect();
        b.tensor_data(name, &[width], F32, &values)
    };
    let (h, i) = (dims.hidden, dims.inter);
    let kv = h / u64::from(dims.heads) * u64::from(dims.kv_heads);
    b = weights(b, "token_embd.weight", &[h, vocab]);
    for l in 0..dims.layers {
        let p = |s: &str| format!("blk.{l}.{s}");
        b = ones(b, &p("attn_norm.weight"), h);
        b = weights(b, &p("attn_q.weight"), &[h, h]);
        b = weights(b, &p("attn_q.bias"), &[h]);
        b = weights(b, &p("attn_k.weight"), &[h, kv]);
        b = weights(b, &p("attn_k.bias"), &[kv]);
        b = weights(b, &p("attn_v.weight"), &[h, kv]);
        b = weights(b, &p("attn_v.bias"), &[kv]);
        b = weights(b, &p("attn_output.weight"), &[h, h]);
        b = ones(b, &p("ffn_norm.weight"), h);
        b = weights(b, &p("ffn_gate.weight"), &[h, i]);
        b = weights(b, &p("ffn_up.weight"), &[h, i]);
        b = weights(b, &p("ffn_down.weight"), &[i, h]);
    }
    b = ones(b, "output_norm.weight", h);
    weights(b, "output.weight", &[h, vocab])
}

/// Asserts that `gguf`'s header and tensor table, entry by entry, are what the Python `gguf`
/// package read from the same file (`expected`: a fixture written by `make_fixture.py`).
pub fn assert_table_like_gguf_py(gguf: &GgufFile, expected: &Json) {
    let field = |key: &str| expected[key].as_u64().unwrap();
    assert_eq!(u64::from(gguf.version()), field("version"));
    assert_eq!(gguf.file_len(), field("file_len"));
    assert_eq!(gguf.tensors().len() as u64, field("tensor_count"));
    assert_eq!(gguf.metadata().len() as u64, field("kv_count"));
    assert_eq!(gguf.alignment(), field("alignment"));
    assert_eq!(gguf.data_offset(), field("data_offset"));
    let tensors = expected["tensors"].as_array().unwrap();
    assert_eq!(gguf.tensors().len(), tensors.len());
    for (info, want) in gguf.tensors().iter().zip(tensors) {
        let name = info.name();
        assert_eq!(name, want["name"].as_str().unwrap());
        let ggml_type = want["ggml_type"].as_str().unwrap();
        assert_eq!(info.ggml_type().name(), ggml_type, "{name}");
        assert_eq!(info.dims(), u64s(&want["dims"]), "{name}");
        assert_eq!(info.offset(), want["offset"].as_u64().unwrap(), "{name}");
        assert_eq!(info.byte_len(), want["n_bytes"].as_u64().unwrap(), "{name}");
    }
}
