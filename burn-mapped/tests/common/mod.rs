//! Fixtures shared by the integration tests: a small module exercising both `Linear` layouts,
//! an embedding and a bare parameter, and helpers that look at memory from outside the crate
//! (the Flex storage pointer, `/proc/self/maps`).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use burn::backend::Flex;
use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, LinearLayout};
use burn::tensor::{Device, Int, Tensor, TensorData};

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

/// Deterministic input tokens.
pub fn tokens(device: &Device) -> Tensor<2, Int> {
    let ids: Vec<i64> = (0..12).map(|i| (i * 7 + 3) % VOCAB as i64).collect();
    Tensor::from_data(TensorData::new(ids, [2, 6]), device)
}

/// A fresh temporary directory that removes itself.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("burn-mapped-test")
        .tempdir()
        .unwrap()
}

/// Address of the first byte of a Flex tensor's storage.
pub fn flex_storage<const D: usize>(tensor: Tensor<D>) -> std::ops::Range<usize> {
    let flex = tensor
        .try_into_primitive::<Flex>()
        .expect("the default test device is Flex");
    let bytes = flex.bytes();
    let start = bytes.as_ptr() as usize;
    start..start + bytes.len()
}

/// Every (path, storage range) of the float parameters of a module, as Flex sees them.
pub fn float_param_storage<M: Module>(module: &M) -> Vec<(String, std::ops::Range<usize>)> {
    struct V {
        path: Vec<String>,
        out: Vec<(String, std::ops::Range<usize>)>,
    }
    impl ModuleVisitor for V {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.path.push(name.to_string());
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.out.push((self.path.join("."), flex_storage(param.val())));
        }
    }
    let mut v = V {
        path: Vec::new(),
        out: Vec::new(),
    };
    module.visit(&mut v);
    v.out
}

/// Address ranges where `path` is mapped in this process, read from `/proc/self/maps`
/// (independent of the crate's own bookkeeping).
pub fn mapped_ranges(path: &Path) -> Vec<std::ops::Range<usize>> {
    let path = std::fs::canonicalize(path).unwrap();
    let path = path.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.split_whitespace().nth(5) == Some(path.as_str()))
        .map(|l| {
            let (lo, hi) = l.split_whitespace().next().unwrap().split_once('-').unwrap();
            usize::from_str_radix(lo, 16).unwrap()..usize::from_str_radix(hi, 16).unwrap()
        })
        .collect()
}

/// Runs the ignored test `name` of the current test binary in a child process with `envs`,
/// returning its stdout. Used for measurements that need a fresh address space.
pub fn run_child(name: &str, envs: &[(&str, &str)]) -> String {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args([name, "--exact", "--ignored", "--nocapture", "--test-threads=1"]);
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
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect()
}
