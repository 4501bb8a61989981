//! Arbitrary bytes into the store-manifest parser: it must return a typed error or a manifest
//! whose every promise holds, and never panic.
//!
//! Run: `RUSTC_BOOTSTRAP=1 cargo fuzz run manifest_parse` from `burn-mapped/`.

#![no_main]

use libfuzzer_sys::fuzz_target;

// The manifest and what it uses are compiled in from source: they depend on burn-std only,
// so the fuzz build does not instrument all of burn.
#[path = "../../src/dtype.rs"]
#[allow(dead_code)]
mod dtype;
#[path = "../../src/error.rs"]
#[allow(dead_code)]
mod error;
#[path = "../../src/layout.rs"]
#[allow(dead_code)]
mod layout;
#[path = "../../src/manifest.rs"]
#[allow(dead_code)]
mod manifest;

fuzz_target!(|data: &[u8]| {
    let Ok(m) = manifest::Manifest::parse(data, std::path::Path::new("fuzz/manifest.json")) else {
        return;
    };
    let mut files = std::collections::HashSet::new();
    for t in m.tensors() {
        assert!(std::ptr::eq(m.get(t.name()).unwrap(), t));
        assert!(files.insert(t.file().to_string()));
        assert!(!t.file().contains('/') && t.file() != ".." && t.file() != ".");
        let elems: u64 = t.shape().iter().map(|&d| d as u64).product();
        assert_eq!(elems * t.dtype().size() as u64, t.len());
        assert!(t.padded_len() >= t.len() && t.padded_len() % layout::ALIGNMENT == 0);
    }
    // What parses must serialize and parse back to the same manifest.
    let again = manifest::Manifest::parse(m.to_json().as_bytes(), std::path::Path::new("x")).unwrap();
    assert_eq!(again, m);
});
