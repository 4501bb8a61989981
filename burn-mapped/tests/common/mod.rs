//! Fixtures shared by this crate's integration tests: a small module exercising both `Linear`
//! layouts, an embedding and a bare parameter, and child processes for measurements that need
//! a fresh address space. Helpers that look at memory from outside the crate (the Flex storage
//! pointer, `/proc/self/maps`) are the workspace's shared test support (`burn_mapped_tests`).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use burn::module::{Module, Param};
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, LinearLayout};
use burn::tensor::{Device, Int, Tensor, TensorData};
use burn_mapped::MappedRecorder;

#[derive(Module, Debug)]
pub struct Net {
    pub embed: Embedding,
    pub col: Linear,
    pub row: Linear,
    pub gain: Param<Tensor<1>>,
}

pub const VOCAB: usize = 50;
pub const HIDDEN: usize = 24;
pub const OUT: usize = 20;

impl Net {
    /// Lazily initialized: no initializer runs until a parameter is read.
    pub fn init(device: &Device) -> Self {
        Self {
            embed: EmbeddingConfig::new(VOCAB, HIDDEN).init(device),
            col: LinearConfig::new(HIDDEN, HIDDEN)
                .with_layout(LinearLayout::Col)
                .init(device),
            row: LinearConfig::new(HIDDEN, OUT).init(device),
            gain: Param::from_tensor(Tensor::ones([OUT], device)),
        }
    }

    pub fn forward(&self, tokens: Tensor<2, Int>) -> Tensor<3> {
        let x = self.embed.forward(tokens);
        let x = self.col.forward(x).tanh();
        let x = self.row.forward(x);
        x * self.gain.val().unsqueeze::<3>()
    }
}

/// A [`Net`] recorded into a store under a fresh temporary directory: the directory's guard,
/// the store's path and the recorded module.
pub fn recorded_net() -> (tempfile::TempDir, PathBuf, Net) {
    let tmp = burn_mapped_tests::tempdir();
    let dir = tmp.path().join("store");
    let net = Net::init(&Device::flex());
    MappedRecorder::default().record(&net, &dir).unwrap();
    (tmp, dir, net)
}

/// [`recorded_net`], with the recorded module's output on [`tokens`] on Flex (what a module
/// loaded from the store must reproduce) in its place.
pub fn recorded_net_and_output() -> (tempfile::TempDir, PathBuf, TensorData) {
    let (tmp, dir, net) = recorded_net();
    let output = net.forward(tokens(&Device::flex())).into_data();
    (tmp, dir, output)
}

/// Deterministic input tokens.
pub fn tokens(device: &Device) -> Tensor<2, Int> {
    let ids: Vec<i64> = (0..12).map(|i| (i * 7 + 3) % VOCAB as i64).collect();
    Tensor::from_data(TensorData::new(ids, [2, 6]), device)
}

/// Runs the ignored test `name` of the current test binary in a child process with `envs`,
/// returning its stdout. Used for measurements that need a fresh address space.
pub fn run_child(name: &str, envs: &[(&str, &str)]) -> String {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args([
        name,
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "child `{name}` failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The line of a child's stdout that starts with `key=`, parsed.
pub fn child_value<T: std::str::FromStr>(stdout: &str, key: &str) -> T
where
    T::Err: std::fmt::Debug,
{
    let prefix = format!("{key}=");
    stdout
        .split_whitespace()
        .find_map(|token| token.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no `{key}` in child output:\n{stdout}"))
        .trim()
        .parse()
        .unwrap()
}

/// Bytes of every tensor file in a store, read with plain `read` (for before/after checks).
pub fn file_snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    burn_mapped_tests::synthetic::sorted_entries(dir)
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect()
}

/// Reads a weight's values straight from its file (independent of Burn).
pub fn file_f32(dir: &Path, name: &str) -> Vec<f32> {
    let manifest = burn_mapped::Manifest::read(dir).unwrap();
    let entry = manifest.get(name).unwrap();
    let bytes = std::fs::read(dir.join(entry.file())).unwrap();
    bytes[..entry.len() as usize]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Asserts that `w` (`[_, OUT]`, holding `reference`) with its top-left 2x2 corner set to 9 by
/// `slice_assign`, an op that writes its output, reads 9 there and `reference` elsewhere.
pub fn assert_corner_patched(w: &Tensor<2>, reference: &[f32]) {
    let patch = Tensor::<2>::from_data(TensorData::new(vec![9.0f32; 4], [2, 2]), &w.device());
    let patched = w.clone().slice_assign([0..2, 0..2], patch);
    let patched = patched
        .into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .unwrap();
    assert_eq!(patched.len(), reference.len());
    for (i, (v, r)) in patched.iter().zip(reference).enumerate() {
        let (row, col) = (i / OUT, i % OUT);
        let want = if row < 2 && col < 2 { 9.0 } else { *r };
        assert_eq!(*v, want, "element {row},{col}");
    }
}
