//! `burn-mapped convert --dtype q8` and `inspect` through their `run` / `report` functions: the
//! checkpoint is written here with the `safetensors` crate, and the stored int8 values and f16
//! scales are read back from the tensor files with plain `std::fs::read`; the quantization error
//! is recomputed here in f64.

use std::path::Path;

use burn_mapped::Manifest;
use burn_mapped::convert::WeightFormat;
use burn_mapped_tests::numeric::{f16_value, f32_le_bytes};
use burn_mapped_tests::synthetic::{RawTensor, XorShift, write_safetensors};
use burn_mapped_tests::tempdir;
use burn_mapped_tools::cli::convert::{self, ConvertArgs};
use burn_mapped_tools::cli::inspect;
use safetensors::Dtype;

/// Deterministic values of varied sign and magnitude, never zero.
fn values(n: usize, seed: u64) -> Vec<f32> {
    XorShift::seeded(seed)
        .take(n)
        .enumerate()
        .map(|(i, x)| {
            let unit = (x >> 40) as f32 / (1u64 << 24) as f32;
            let sign = if x & 1 == 0 { 1.0 } else { -1.0 };
            sign * (0.05 + unit) * (1 + i % 5) as f32
        })
        .collect()
}

/// Writes f32 tensors as a safetensors file.
fn write_f32_safetensors(path: &Path, tensors: &[(&str, Vec<usize>, Vec<f32>)]) {
    let raw: Vec<RawTensor<&str>> = tensors
        .iter()
        .map(|(name, shape, values)| {
            let bytes = f32_le_bytes(values.iter().copied());
            (*name, Dtype::F32, shape.clone(), bytes)
        })
        .collect();
    write_safetensors(path, &raw, None);
}

/// `||W - s q||_F / ||W||_F` from the store's files, read without the crate's store reader.
fn error_from_files(dir: &Path, manifest: &Manifest, name: &str, w: &[f32]) -> f64 {
    let entry = manifest.get(name).unwrap();
    let [out, inp] = [entry.shape()[0], entry.shape()[1]];
    let q = std::fs::read(dir.join(entry.file())).unwrap();
    let scale = manifest.get(&format!("{name}_scale")).unwrap();
    let s = std::fs::read(dir.join(scale.file())).unwrap();
    let (mut diff, mut norm) = (0f64, 0f64);
    for o in 0..out {
        let so = f16_value(u16::from_le_bytes([s[2 * o], s[2 * o + 1]]));
        for i in 0..inp {
            let v = f64::from(w[o * inp + i]);
            let d = v - so * f64::from(q[o * inp + i] as i8);
            diff += d * d;
            norm += v * v;
        }
    }
    (diff / norm).sqrt()
}

#[test]
fn convert_q8_then_inspect_reports_each_error_and_the_worst_and_mean() {
    let tmp = tempdir();
    let input = tmp.path().join("model.safetensors");
    let tensors = vec![
        ("model.embed_tokens.weight", vec![40, 16], values(640, 1)),
        (
            "model.layers.0.self_attn.q_proj.weight",
            vec![16, 16],
            values(256, 2),
        ),
        (
            "model.layers.0.self_attn.q_proj.bias",
            vec![16],
            values(16, 3),
        ),
        (
            "model.layers.0.mlp.down_proj.weight",
            vec![16, 44],
            values(704, 4),
        ),
        ("model.norm.weight", vec![16], values(16, 5)),
        ("lm_head.weight", vec![40, 16], values(640, 6)),
    ];
    write_f32_safetensors(&input, &tensors);
    let out = tmp.path().join("store");
    convert::run(&ConvertArgs {
        input: input.clone(),
        out: out.clone(),
        dtype: Some(WeightFormat::Q8),
        quiet: true,
        force: false,
    })
    .unwrap();

    let manifest = Manifest::read(&out).unwrap();
    let report = inspect::report(&out).unwrap();
    let mut errors = Vec::new();
    for (name, shape, w) in &tensors {
        let row = report.tensors.iter().find(|t| t.name == *name).unwrap();
        if name.ends_with("proj.weight") || *name == "lm_head.weight" {
            assert_eq!(row.dtype, "i8", "{name}");
            let want = error_from_files(&out, &manifest, name, w);
            let got = row.quant.as_ref().unwrap().rel_error.unwrap();
            // Recorded as an f32.
            assert!((got - want).abs() <= 1e-7 * want, "{name}: {got} vs {want}");
            assert!(want > 1e-4 && want < 1e-2, "{name}: {want}");
            errors.push((name.to_string(), want));
        } else {
            assert_eq!((row.dtype.as_str(), &row.shape), ("f32", shape), "{name}");
            assert!(row.quant.is_none(), "{name}");
        }
    }
    assert_eq!(errors.len(), 3);
    let summary = report.quant_error.as_ref().unwrap();
    let mean = errors.iter().map(|e| e.1).sum::<f64>() / 3.0;
    let worst = errors.iter().max_by(|a, b| a.1.total_cmp(&b.1)).unwrap();
    assert_eq!((summary.matrices, summary.unrecorded), (3, 0));
    assert!((summary.mean - mean).abs() <= 1e-7 * mean);
    assert!((summary.worst - worst.1).abs() <= 1e-7 * worst.1);
    assert_eq!(summary.worst_tensor, worst.0);

    let table = inspect::render_table(&report);
    assert!(table.lines().next().unwrap().ends_with("q8 err"), "{table}");
    let head_line = table
        .lines()
        .find(|l| l.starts_with("lm_head.weight "))
        .unwrap();
    // Rendered from the report's values, which were checked above.
    let head = report
        .tensors
        .iter()
        .find(|t| t.name == "lm_head.weight")
        .unwrap();
    let head_err = head.quant.as_ref().unwrap().rel_error.unwrap();
    assert!(
        head_line.ends_with(&format!("{head_err:.3e}")),
        "{head_line}"
    );
    assert!(
        table.contains(&format!(
            "q8: 3 matrices, relative error ||W - deq(Q)||/||W||: mean {:.3e}, worst {:.3e} ({})",
            summary.mean, summary.worst, worst.0
        )),
        "{table}"
    );
    // The JSON report round-trips with the errors in it.
    let json = serde_json::to_string(&report).unwrap();
    let back: inspect::InspectReport = serde_json::from_str(&json).unwrap();
    assert_eq!(back.quant_error.unwrap().worst_tensor, worst.0);
}

#[test]
fn a_float_store_reports_no_quantization() {
    let tmp = tempdir();
    let input = tmp.path().join("model.safetensors");
    write_f32_safetensors(&input, &[("lm_head.weight", vec![4, 4], values(16, 7))]);
    let out = tmp.path().join("store");
    convert::run(&ConvertArgs {
        input,
        out: out.clone(),
        dtype: None,
        quiet: true,
        force: false,
    })
    .unwrap();
    let report = inspect::report(&out).unwrap();
    assert!(report.quant_error.is_none());
    assert!(!inspect::render_table(&report).contains("q8:"));
}
