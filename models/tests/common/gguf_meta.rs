//! TEST-ONLY minimal GGUF metadata reader: the header and key/value section, enough to pull
//! the tokenizer arrays out of the real checkpoint. It stops before the tensor infos and
//! reads no tensor data. Not the crate's GGUF reader; may be replaced by it once merged.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::Path;

/// Caps against a corrupt file asking for a huge allocation.
const MAX_STRING: u64 = 64 << 20;
const MAX_ARRAY: u64 = 16 << 20;

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    UInt(u64),
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    Strings(Vec<String>),
    Ints(Vec<i64>),
    /// An array of another element type, kept only as its length.
    OtherArray(u64),
}

/// The key/value section of a GGUF file.
pub fn read_metadata(path: &Path) -> io::Result<HashMap<String, Value>> {
    let mut r = BufReader::with_capacity(1 << 20, File::open(path)?);
    let mut magic = [0u8; 4];
    r.read_exact(&mut magic)?;
    if &magic != b"GGUF" {
        return Err(bad(format!("{}: not a GGUF file", path.display())));
    }
    let version = u32(&mut r)?;
    if !(2..=3).contains(&version) {
        return Err(bad(format!("GGUF version {version} not supported")));
    }
    let _tensor_count = u64(&mut r)?;
    let kv_count = u64(&mut r)?;
    let mut out = HashMap::new();
    for _ in 0..kv_count {
        let key = string(&mut r)?;
        let ty = u32(&mut r)?;
        let value = value(&mut r, ty).map_err(|e| bad(format!("key {key}: {e}")))?;
        out.insert(key, value);
    }
    Ok(out)
}

fn value(r: &mut impl Read, ty: u32) -> io::Result<Value> {
    Ok(match ty {
        0 => Value::UInt(bytes::<1>(r)?[0] as u64),
        1 => Value::Int(bytes::<1>(r)?[0] as i8 as i64),
        2 => Value::UInt(u16::from_le_bytes(bytes(r)?) as u64),
        3 => Value::Int(i16::from_le_bytes(bytes(r)?) as i64),
        4 => Value::UInt(u32(r)? as u64),
        5 => Value::Int(i32::from_le_bytes(bytes(r)?) as i64),
        6 => Value::Float(f32::from_le_bytes(bytes(r)?) as f64),
        7 => Value::Bool(bytes::<1>(r)?[0] != 0),
        8 => Value::Str(string(r)?),
        9 => {
            let elem = u32(r)?;
            let n = u64(r)?;
            if n > MAX_ARRAY {
                return Err(bad(format!("array of {n} elements")));
            }
            match elem {
                8 => Value::Strings((0..n).map(|_| string(r)).collect::<io::Result<_>>()?),
                0..=5 | 10 | 11 => {
                    let ints = (0..n)
                        .map(|_| match value(r, elem)? {
                            Value::UInt(v) => Ok(v as i64),
                            Value::Int(v) => Ok(v),
                            _ => unreachable!("integer element types give integers"),
                        })
                        .collect::<io::Result<_>>()?;
                    Value::Ints(ints)
                }
                _ => {
                    for _ in 0..n {
                        value(r, elem)?;
                    }
                    Value::OtherArray(n)
                }
            }
        }
        10 => Value::UInt(u64(r)?),
        11 => Value::Int(i64::from_le_bytes(bytes(r)?)),
        12 => Value::Float(f64::from_le_bytes(bytes(r)?)),
        _ => return Err(bad(format!("unknown value type {ty}"))),
    })
}

fn bytes<const N: usize>(r: &mut impl Read) -> io::Result<[u8; N]> {
    let mut b = [0u8; N];
    r.read_exact(&mut b)?;
    Ok(b)
}

fn u32(r: &mut impl Read) -> io::Result<u32> {
    Ok(u32::from_le_bytes(bytes(r)?))
}

fn u64(r: &mut impl Read) -> io::Result<u64> {
    Ok(u64::from_le_bytes(bytes(r)?))
}

fn string(r: &mut impl Read) -> io::Result<String> {
    let n = u64(r)?;
    if n > MAX_STRING {
        return Err(bad(format!("string of {n} bytes")));
    }
    let mut buf = vec![0u8; n as usize];
    r.read_exact(&mut buf)?;
    String::from_utf8(buf).map_err(|e| bad(format!("string is not UTF-8: {e}")))
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// The `tokenizer.*` entries the Qwen2 tokenizer is built from.
#[derive(Debug)]
pub struct TokenizerMeta {
    pub model: String,
    pub pre: String,
    pub tokens: Vec<String>,
    pub token_types: Vec<i32>,
    pub merges: Vec<String>,
    pub eos: u32,
    pub bos: Option<u32>,
    pub add_bos: bool,
    pub chat_template: Option<String>,
}

pub fn tokenizer_meta(path: &Path) -> TokenizerMeta {
    let mut kv = read_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut take = |key: &str| {
        kv.remove(key)
            .unwrap_or_else(|| panic!("{}: no {key}", path.display()))
    };
    let text = |v: Value| match v {
        Value::Str(s) => s,
        other => panic!("expected a string, found {other:?}"),
    };
    let id = |v: Value| match v {
        Value::UInt(n) => u32::try_from(n).expect("token id fits u32"),
        other => panic!("expected an unsigned id, found {other:?}"),
    };
    let strings = |v: Value| match v {
        Value::Strings(s) => s,
        other => panic!("expected a string array, found {other:?}"),
    };
    let model = text(take("tokenizer.ggml.model"));
    let pre = text(take("tokenizer.ggml.pre"));
    let tokens = strings(take("tokenizer.ggml.tokens"));
    let merges = strings(take("tokenizer.ggml.merges"));
    let token_types = match take("tokenizer.ggml.token_type") {
        Value::Ints(v) => v
            .into_iter()
            .map(|t| i32::try_from(t).expect("token type fits i32"))
            .collect(),
        other => panic!("expected an integer array, found {other:?}"),
    };
    let eos = id(take("tokenizer.ggml.eos_token_id"));
    let bos = kv.remove("tokenizer.ggml.bos_token_id").map(id);
    let add_bos = match kv.remove("tokenizer.ggml.add_bos_token") {
        Some(Value::Bool(b)) => b,
        None => false,
        Some(other) => panic!("expected a bool add_bos_token, found {other:?}"),
    };
    let chat_template = kv.remove("tokenizer.chat_template").map(text);
    TokenizerMeta {
        model,
        pre,
        tokens,
        token_types,
        merges,
        eos,
        bos,
        add_bos,
        chat_template,
    }
}
