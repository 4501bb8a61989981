//! The fixtures' JSON read back: arrays of numbers, every element checked to be one.

use serde_json::Value;

/// The JSON array `v`, each element read by `read` (`None`: not a `what`, a broken fixture).
fn array<T>(v: &Value, what: &str, read: impl Fn(&Value) -> Option<T>) -> Vec<T> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| read(x).unwrap_or_else(|| panic!("not {what}: {x}")))
        .collect()
}

/// A JSON array of unsigned integers.
pub fn u64s(v: &Value) -> Vec<u64> {
    array(v, "a u64", Value::as_u64)
}

/// A JSON array of token ids (or of other 32-bit words).
pub fn u32s(v: &Value) -> Vec<u32> {
    array(v, "a u32", |x| x.as_u64()?.try_into().ok())
}

/// A JSON array of sizes (dimensions, indices).
pub fn usizes(v: &Value) -> Vec<usize> {
    array(v, "a usize", |x| x.as_u64()?.try_into().ok())
}

/// A JSON array of numbers.
pub fn f64s(v: &Value) -> Vec<f64> {
    array(v, "a number", Value::as_f64)
}
