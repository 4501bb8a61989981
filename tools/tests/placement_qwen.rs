//! The Qwen loader's placements on the tiny transformers fixtures (models/tests/fixtures): every
//! placement reproduces transformers' own logits and greedy tokens; resident weights live outside
//! the store's mappings; per-use copy copies every projection's bytes on every forward.

use std::ops::Range;
use std::path::{Path, PathBuf};

use burn::backend::Flex;
use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{Device, Int, Tensor, TensorData};
use burn_mapped::Placement;
use burn_mapped::convert::{ConvertOptions, from_safetensors};
use burn_mapped_models::qwen2::{Qwen2Config, argmax};
use burn_mapped_tools::qwen::{PlacedQwen, load_placed_with};

/// Same bound as the models crate's fixture test: f32 with different summation orders.
const MAX_RELATIVE_ERROR: f64 = 1e-4;

fn fixture(variant: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../models/tests/fixtures/tiny_qwen2")
        .join(variant)
}

struct Reference {
    prompt: Vec<u32>,
    generated: Vec<u32>,
    logits: Vec<Vec<f32>>,
}

fn reference(variant: &str) -> Reference {
    let dir = fixture(variant);
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let ids = |key: &str| -> Vec<u32> {
        meta[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect()
    };
    let vocab = meta["vocab_size"].as_u64().unwrap() as usize;
    let bytes = std::fs::read(dir.join("logits.f32")).unwrap();
    let flat: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    Reference {
        prompt: ids("prompt"),
        generated: ids("generated"),
        logits: flat.chunks(vocab).map(<[f32]>::to_vec).collect(),
    }
}

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

fn load(variant: &str, dir: &Path, placement: Placement) -> PlacedQwen {
    let config_path = fixture(variant).join("config.json");
    load_placed_with(
        dir,
        &Device::flex(),
        burn_mapped::MappedStore::options(),
        placement,
        |_| Ok(Qwen2Config::from_hf_json(&config_path)?),
    )
    .unwrap()
}

fn relative_error(ours: &[f32], hf: &[f32]) -> f64 {
    let scale = hf.iter().fold(0f64, |m, &x| m.max(f64::from(x).abs()));
    let diff = ours.iter().zip(hf).fold(0f64, |m, (&a, &b)| {
        m.max((f64::from(a) - f64::from(b)).abs())
    });
    diff / scale
}

fn tokens(ids: &[u32]) -> Tensor<2, Int> {
    Tensor::from_data(
        TensorData::new(ids.iter().map(|&t| t as i64).collect(), [1, ids.len()]),
        &Device::flex(),
    )
}

/// Prefill, then cached single-token steps fed our own greedy choice, against transformers.
/// Calls `after_forward` with the number of forwards run so far.
fn matches_transformers(placed: &PlacedQwen, r: &Reference, mut after_forward: impl FnMut(u64)) {
    let model = &placed.loaded.model;
    let steps = r.generated.len() - 1;
    let mut cache = model.new_cache(1, r.prompt.len() + steps);
    let rows = |logits: Tensor<3>| -> Vec<Vec<f32>> {
        let vocab = logits.dims()[2];
        let flat = logits.try_into_vec_as::<f32>().unwrap();
        flat.chunks(vocab).map(<[f32]>::to_vec).collect()
    };
    let prefill = rows(model.forward(tokens(&r.prompt), &mut cache).unwrap());
    after_forward(1);
    for (pos, row) in prefill.iter().enumerate() {
        let err = relative_error(row, &r.logits[pos]);
        assert!(
            err < MAX_RELATIVE_ERROR,
            "{}: prefill {pos}: {err:e}",
            placed.placement
        );
    }
    let mut token = argmax(prefill.last().unwrap()).unwrap();
    let mut chosen = vec![token];
    for step in 0..steps {
        let row = rows(model.forward(tokens(&[token]), &mut cache).unwrap()).remove(0);
        after_forward(step as u64 + 2);
        let err = relative_error(&row, &r.logits[r.prompt.len() + step]);
        assert!(
            err < MAX_RELATIVE_ERROR,
            "{}: step {step}: {err:e}",
            placed.placement
        );
        token = argmax(&row).unwrap();
        chosen.push(token);
    }
    assert_eq!(chosen, r.generated, "{}: greedy tokens", placed.placement);
}

/// Storage ranges of a module's float parameters as Flex holds them.
fn float_storage<M: Module>(module: &M) -> Vec<(String, Range<usize>)> {
    struct V(Vec<String>, Vec<(String, Range<usize>)>);
    impl ModuleVisitor for V {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.0.push(name.to_owned());
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.0.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let flex = param.val().try_into_primitive::<Flex>().unwrap();
            let start = flex.bytes().as_ptr() as usize;
            self.1
                .push((self.0.join("."), start..start + flex.bytes().len()));
        }
    }
    let mut v = V(Vec::new(), Vec::new());
    module.visit(&mut v);
    v.1
}

/// Where the store's tensor files are mapped in this process, from `/proc/self/maps`.
fn store_mappings(dir: &Path) -> Vec<Range<usize>> {
    let dir = std::fs::canonicalize(dir).unwrap();
    let dir = dir.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .nth(5)
                .is_some_and(|p| p.starts_with(&dir) && p.ends_with(".tensor"))
        })
        .map(|l| {
            let (lo, hi) = l
                .split_whitespace()
                .next()
                .unwrap()
                .split_once('-')
                .unwrap();
            usize::from_str_radix(lo, 16).unwrap()..usize::from_str_radix(hi, 16).unwrap()
        })
        .collect()
}

fn inside(range: &Range<usize>, maps: &[Range<usize>]) -> bool {
    maps.iter()
        .any(|m| m.start <= range.start && range.end <= m.end)
}

fn overlaps(range: &Range<usize>, maps: &[Range<usize>]) -> bool {
    maps.iter()
        .any(|m| m.start < range.end && range.start < m.end)
}

#[test]
fn every_placement_matches_transformers_on_both_fixtures() {
    let tmp = tempfile::tempdir().unwrap();
    for variant in ["tied", "untied"] {
        let dir = store(variant, tmp.path());
        let r = reference(variant);
        for placement in [Placement::Map, Placement::Resident, Placement::PerUseCopy] {
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
    for (path, range) in float_storage(&mapped.loaded.model) {
        assert!(inside(&range, &maps), "map: {path} is not a mapped page");
    }
    drop(mapped);

    let resident = load("untied", &dir, Placement::Resident);
    let maps = store_mappings(&dir);
    let storage = float_storage(&resident.loaded.model);
    assert!(!storage.is_empty());
    for (path, range) in storage {
        assert!(
            !overlaps(&range, &maps),
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
        for (path, range) in float_storage(&placed.loaded.model) {
            assert!(
                inside(&range, &maps),
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
