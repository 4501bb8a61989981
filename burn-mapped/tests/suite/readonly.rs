//! Nothing in Burn writes adopted bytes: functional ops allocate fresh outputs, in-place ops
//! copy first (or, in strict mode, fail naming the tensor), and the files are byte-identical
//! afterwards.

use crate::common;

use burn::store::ModuleSnapshot;
use burn::tensor::{Device, Tensor, TensorData};
use burn_mapped::{MappedStore, StoreError, readonly::StrictMode};
use burn_mapped_tests::assert_strict_refusal;
use common::*;

fn load(dir: &std::path::Path, strict: bool) -> Net {
    let mut net = Net::init(&Device::flex());
    let mut store = MappedStore::options().strict(strict).open(dir).unwrap();
    net.load_from(&mut store).unwrap();
    net
}

/// Reads the weight's values straight from its file, as f64 (independent of Burn).
fn file_values(dir: &std::path::Path, name: &str) -> Vec<f64> {
    file_f32(dir, name).into_iter().map(f64::from).collect()
}

fn values(t: Tensor<2>) -> Vec<f64> {
    t.into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .unwrap()
        .into_iter()
        .map(f64::from)
        .collect()
}

#[test]
fn strict_mode_runs_a_full_forward_pass() {
    let (_tmp, dir, expected) = recorded_net_and_output();
    let before = file_snapshot(&dir);
    let net = load(&dir, true);
    let got = net.forward(tokens(&Device::flex())).into_data();
    assert_eq!(got.as_bytes(), expected.as_bytes());
    assert_eq!(file_snapshot(&dir), before);
}

/// A recorded net's store and its files' bytes before the net is loaded from it.
struct Recorded {
    _tmp: tempfile::TempDir,
    dir: std::path::PathBuf,
    before: Vec<(std::path::PathBuf, Vec<u8>)>,
}

impl Recorded {
    /// The store, and the net loaded from it (in `strict` mode or not).
    fn load(strict: bool) -> (Self, Net) {
        let (tmp, dir, _) = recorded_net();
        let before = file_snapshot(&dir);
        let net = load(&dir, strict);
        let store = Self {
            _tmp: tmp,
            dir,
            before,
        };
        (store, net)
    }

    /// `row.weight`'s values read straight from its file.
    fn row_weight(&self) -> Vec<f64> {
        file_values(&self.dir, "row.weight")
    }

    /// The store, and `row.weight` loaded from it (in `strict` mode or not) and held alone: the
    /// module dropped, so Flex may pick the weight's storage as an in-place op's output.
    fn load_sole_row_weight(strict: bool) -> (Self, Tensor<2>) {
        let (store, net) = Self::load(strict);
        let w = net.row.weight.val();
        drop(net);
        (store, w)
    }

    /// Asserts that ops which only read `w`, the loaded `row.weight` (`w + 1`, `exp(w)`), give
    /// its file's values so changed; returns those values.
    fn assert_reads_run(&self, w: &Tensor<2>) -> Vec<f64> {
        let reference = self.row_weight();
        assert_plus_one(&values(w.clone() + 1.0), &reference);
        let exp = values(w.clone().exp());
        for (e, r) in exp.iter().zip(&reference) {
            assert!((e - r.exp()).abs() <= 1e-6 * r.exp().max(1.0));
        }
        reference
    }

    /// Asserts that the store's files hold the bytes they held before the load, and that the
    /// store still verifies.
    fn assert_files_unchanged(&self) {
        assert_eq!(file_snapshot(&self.dir), self.before);
        assert!(MappedStore::open(&self.dir).unwrap().verify().is_empty());
    }
}

/// Asserts that `got` is `reference + 1`, to f32's rounding.
fn assert_plus_one(got: &[f64], reference: &[f64]) {
    assert_eq!(got.len(), reference.len());
    for (g, r) in got.iter().zip(reference) {
        assert!((g - (r + 1.0)).abs() < 1e-6, "{g} for {r} + 1");
    }
}

#[test]
fn functional_ops_on_weights_allocate_fresh_outputs() {
    let (store, net) = Recorded::load(false);
    let w = net.row.weight.val();
    let reference = store.assert_reads_run(&w);
    assert_corner_patched(&w, &file_f32(&store.dir, "row.weight"));
    // The weight itself still reads the file's values.
    assert_eq!(values(w), reference);
    store.assert_files_unchanged();
}

#[test]
fn strict_mode_allows_reads_and_names_the_weight_an_op_tries_to_write() {
    let (store, net) = Recorded::load(true);
    let w = net.row.weight.val();
    // Ops that only read the weight run as usual.
    let reference = store.assert_reads_run(&w);
    // Flex's slice_assign clones the shared storage without copying and then writes the
    // clone: a write request on mapped bytes, which strict mode exists to expose.
    let patch = Tensor::<2>::from_data(TensorData::new(vec![9.0f32; 4], [2, 2]), &w.device());
    assert_strict_refusal("row.weight", || {
        let _ = w.clone().slice_assign([0..2, 0..2], patch).into_data();
    });
    assert_eq!(values(w), reference);
    store.assert_files_unchanged();
}

#[test]
fn in_place_op_on_a_sole_owned_weight_copies_first_by_default() {
    let (store, w) = Recorded::load_sole_row_weight(false);
    // `w` is now the only owner, so Flex may choose it as the in-place output.
    assert_plus_one(&values(w + 1.0), &store.row_weight());
    store.assert_files_unchanged();
}

#[test]
fn in_place_op_on_a_sole_owned_weight_fails_in_strict_mode_naming_it() {
    let (store, w) = Recorded::load_sole_row_weight(true);
    assert_strict_refusal("row.weight", || {
        let _ = (w + 1.0).into_data();
    });
    store.assert_files_unchanged();
}

#[test]
fn explicit_write_access_is_a_typed_error() {
    let (_tmp, dir, _) = recorded_net();
    let mut store = MappedStore::open(&dir).unwrap();
    match store.bytes_mut("col.weight") {
        Err(StoreError::ReadOnly { tensor }) => assert_eq!(tensor, "col.weight"),
        other => panic!("expected ReadOnly, got {other:?}"),
    }
    // Burn's own no-copy write request on adopted bytes is refused.
    let mut bytes = store.tensor_data("col.weight").unwrap().into_bytes();
    assert!(bytes.write(burn_std::Writer::new().no_copy()).is_err());
    // In strict mode even a copying write request is refused, naming the tensor.
    let strict = MappedStore::options().strict(true).open(&dir).unwrap();
    let mut bytes = strict.tensor_data("col.weight").unwrap().into_bytes();
    match bytes.write(burn_std::Writer::new()) {
        Err(burn_std::AccessError::Read(msg)) => assert!(msg.contains("`col.weight`"), "{msg}"),
        other => panic!("expected a refusal, got {:?}", other.map(|b| b.len())),
    }
    assert!(strict.verify().is_empty());
}

#[test]
fn strict_mode_follows_the_environment_variable() {
    let (_tmp, dir, _) = recorded_net();
    let out = run_child(
        "readonly::child_reports_strict_mode",
        &[
            ("BURN_MAPPED_STRICT", "1"),
            ("BM_STORE", dir.to_str().unwrap()),
        ],
    );
    assert_eq!(child_value::<String>(&out, "strict"), "Strict");
    let out = run_child(
        "readonly::child_reports_strict_mode",
        &[("BM_STORE", dir.to_str().unwrap())],
    );
    assert_eq!(child_value::<String>(&out, "strict"), "CopyOnWrite");
}

#[test]
#[ignore = "child process of strict_mode_follows_the_environment_variable"]
fn child_reports_strict_mode() {
    let dir = std::env::var("BM_STORE").unwrap();
    let store = MappedStore::open(dir).unwrap();
    let mode = match store.strict() {
        StrictMode::Strict => "Strict",
        StrictMode::CopyOnWrite => "CopyOnWrite",
    };
    println!("strict={mode}");
}
