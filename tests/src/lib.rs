//! Support shared by the tests of every crate of the workspace (burn-mapped, models, tools,
//! benches and the workspace tests in `tests/`), so that each helper exists once: the real
//! checkpoint and its float64 reference ([`real`]), the tiny transformers fixtures
//! ([`tiny_qwen2`]), inputs the tests write themselves ([`synthetic`]), where this process maps
//! files ([`maps`]), where a backend keeps each parameter's bytes ([`params`], [`flex`]),
//! numbers computed independently of the code under test ([`numeric`]), the fixtures' JSON
//! arrays ([`json`]), GGUF files written byte by byte ([`gguf`]) and, with the `wgpu` feature,
//! the GPU adapter a test runs on (`gpu`).
//!
//! Other crates take this package as a dev-dependency (a cycle cargo allows for integration
//! tests, which link one copy of each crate).

pub mod flex;
pub mod gguf;
#[cfg(feature = "wgpu")]
pub mod gpu;
pub mod json;
pub mod maps;
pub mod numeric;
pub mod params;
pub mod real;
pub mod synthetic;
pub mod tiny_qwen2;
pub mod xorshift;

pub use real::real_gguf;
pub use synthetic::tempdir;

/// Asserts that `op`, a write to the adopted bytes of `tensor` in strict mode, panics with
/// strict mode's refusal naming `tensor`.
pub fn assert_strict_refusal(tensor: &str, op: impl FnOnce()) {
    let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(op))
        .expect_err("strict mode must refuse the write");
    let message = err
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    assert!(
        message.contains(burn_mapped::readonly::REFUSAL),
        "{message}"
    );
    assert!(message.contains(&format!("`{tensor}`")), "{message}");
}

/// Asserts that `value` matches `pattern` (an `if` guard allowed; bindings as in `matches!`),
/// showing `value` where it does not: `std::assert_matches!`, which is unstable.
#[macro_export]
macro_rules! assert_matches {
    ($value:expr, $pattern:pat $(if $guard:expr)? $(,)?) => {
        match $value {
            $pattern $(if $guard)? => {}
            other => panic!(
                "{} does not match {}: {other:?}",
                stringify!($value),
                stringify!($pattern $(if $guard)?)
            ),
        }
    };
}
