//! The loader's placements on the tiny transformers fixtures (models/tests/fixtures): every
//! placement reproduces transformers' own logits and greedy tokens; resident weights live outside
//! the store's mappings; per-use copy copies every projection's bytes on every forward.

use std::path::{Path, PathBuf};

use burn::tensor::Device;
use burn_mapped::Placement;
use burn_mapped::convert::{ConvertOptions, from_safetensors};
use burn_mapped_models::qwen2::Qwen2Config;
use burn_mapped_models::qwen2::load::{LoadError, Loaded, Weights, load_with};
use burn_mapped_tests::flex::float_param_storage;
use burn_mapped_tests::maps::{inside_a_mapping, overlaps_a_mapping, store_mappings};
use burn_mapped_tests::tiny_qwen2::{Reference, decode_like_transformers, fixture, reference};

/// The fixture converted into a store under `tmp`.
fn store(variant: &str, tmp: &Path) -> PathBuf {
    let out = tmp.join(variant);
    from_safetensors(
        fixture(variant).join("model.safetensors"),
        &out,
        &mut ConvertOptions::default(),
    )
    .unwrap();
    out
}

fn load(variant: &str, dir: &Path, placement: Placement) -> Loaded {
    let config_path = fixture(variant).join("config.json");
    load_with(
        Weights::Store(dir),
        &Device::flex(),
        burn_mapped::MappedStore::options(),
        placement,
        |store| {
            Qwen2Config::from_hf_json(&config_path).map_err(|source| LoadError::Config {
                path: store.dir().to_path_buf(),
                source,
            })
        },
    )
    .unwrap()
}

/// The placed model against transformers (see [`decode_like_transformers`]).
fn matches_transformers(placed: &Loaded, r: &Reference, after_forward: impl FnMut(u64)) {
    let what = placed.placement.to_string();
    decode_like_transformers(&placed.model, r, &what, after_forward);
}

#[test]
fn every_placement_matches_transformers_on_both_fixtures() {
    let tmp = tempfile::tempdir().unwrap();
    for variant in ["tied", "untied"] {
        let dir = store(variant, tmp.path());
        let r = reference(variant);
        for placement in Placement::ALL {
            let placed = load(variant, &dir, placement);
            assert_eq!(placed.placement, placement);
            matches_transformers(&placed, &r, |_| {});
        }
    }
}

#[test]
fn map_adopts_and_resident_owns_every_weight() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = store("untied", tmp.path());

    let mapped = load("untied", &dir, Placement::Map);
    let maps = store_mappings(&dir);
    for (path, range) in float_param_storage(&mapped.model) {
        assert!(
            inside_a_mapping(&range, &maps),
            "map: {path} is not a mapped page"
        );
    }
    drop(mapped);

    let resident = load("untied", &dir, Placement::Resident);
    let maps = store_mappings(&dir);
    let storage = float_param_storage(&resident.model);
    assert!(!storage.is_empty());
    for (path, range) in storage {
        assert!(
            !overlaps_a_mapping(&range, &maps),
            "resident: {path} lies in a mapping"
        );
    }
}

/// Bytes of every projection weight and bias, plus the embedding when the head is tied: what
/// one forward of the per-use-copy model must copy, computed from the manifest.
fn projection_bytes(dir: &Path, tied: bool) -> u64 {
    let manifest = burn_mapped::Manifest::read(dir).unwrap();
    let proj: u64 = manifest
        .tensors()
        .iter()
        .filter(|t| t.name().contains("_proj.") || t.name().starts_with("lm_head."))
        .map(|t| t.len())
        .sum();
    let embed = manifest.get("model.embed_tokens.weight").unwrap().len();
    proj + if tied { embed } else { 0 }
}

#[test]
fn per_use_copy_copies_every_projection_on_every_forward() {
    let tmp = tempfile::tempdir().unwrap();
    for (variant, tied) in [("tied", true), ("untied", false)] {
        let dir = store(variant, tmp.path());
        let placed = load(variant, &dir, Placement::PerUseCopy);
        let stager = placed.stager.clone().expect("per-use copy has a stager");
        assert_eq!(stager.staged_bytes(), 0, "nothing is copied at load");
        let per_forward = projection_bytes(&dir, tied);
        assert!(per_forward > 0);
        // The weights at rest are still the mapping.
        let maps = store_mappings(&dir);
        for (path, range) in float_param_storage(&placed.model) {
            assert!(
                inside_a_mapping(&range, &maps),
                "{variant}: {path} at rest is not mapped"
            );
        }
        matches_transformers(&placed, &reference(variant), |forwards| {
            assert_eq!(
                stager.staged_bytes(),
                forwards * per_forward,
                "{variant}: after {forwards} forwards"
            );
        });
    }
}
