//! The step's products over a GGUF's own blocks (Q8_0, Q5_0, Q4_K, Q6_K) on the first wgpu
//! adapter, against the f64 product of the blocks as the GGUF reader decodes them, at the
//! widths of Qwen2.5-0.5B (896, 4864) and of the 7B shape (3584) and 1.5B's MLP (8960).

use burn::tensor::{DType, Int, Tensor, TensorData, f16};
use burn_cubecl::cubecl;
use burn_mapped::gguf::{BlockLayout, GgmlType, dequantize_to_vec, scale_offsets};
use burn_mapped::q8::direct::{
    Addend, DirectWeight, MatrixScratch, Product, fused_products, lookup_rows, matrix_products,
    paired_products, paired_split_products, products, split_words, staged_product,
};
use burn_mapped_tests::synthetic::XorShift;
use cubecl::prelude::*;
use cubecl::server::Handle;

use super::kernels::{self, THREADS};
use super::tests::{
    assert_silu_mul, assert_within, client, floats, norm_input, norm_rows, q8_weight, rms_norm,
    unsplit, upload, upload_u32, values, words,
};

/// Random `ty` blocks, `out` rows of `inp` values, each f16 scale field `0.01` times a value in
/// `[0.5, 1)` so magnitudes stay those of a model's; on the tests' device, with their values
/// as the GGUF reader decodes them.
fn block_weight(ty: GgmlType, out: usize, inp: usize, seed: u64) -> (DirectWeight, Vec<f64>) {
    let layout = BlockLayout::new(ty, inp).expect("whole blocks");
    let mut rng = XorShift::seeded(seed);
    let mut bytes: Vec<u8> = (0..out * layout.row_bytes())
        .map(|_| rng.next_u64() as u8)
        .collect();
    for block in bytes.chunks_exact_mut(ty.type_size() as usize) {
        for &at in scale_offsets(ty) {
            let s = 0.01 * (0.5 + (rng.next_u64() >> 41) as f32 / (1u64 << 24) as f32);
            block[at..at + 2].copy_from_slice(&f16::from_f32(s).to_bits().to_le_bytes());
        }
    }
    let decoded = dequantize_to_vec(ty, &bytes).expect("a type the reader decodes");
    let device = burn_mapped_tests::gpu::wgpu_device().expect("a client implies a device");
    let tensor = Tensor::<2, Int>::from_data(
        TensorData::new(bytes, [out, layout.row_bytes()]),
        (&device, DType::U8),
    );
    let weight = DirectWeight::blocks(&tensor, layout).expect("blocks the kernels read");
    assert_eq!(weight.format(), ty.name());
    (weight, decoded.into_iter().map(f64::from).collect())
}

/// `x W^T` in f64 for rows of `x` (rows of `inp`) and `w` (`[out, inp]`), each element with
/// its bound: with `rounded`, the split's half step of each value's block (2 % margin), and
/// f32 arithmetic at `3e-5` of `sum |x|` times each block's largest weight (a block's sums
/// are scaled by `a` and `m` separately, each at most three times its largest `|a q - m|`).
fn bounds(x: &[f64], w: &[f64], inp: usize, rounded: bool) -> Vec<(f64, f64)> {
    let out = w.len() / inp;
    x.chunks_exact(inp)
        .flat_map(|row| {
            let half_step: Vec<f64> = row
                .chunks_exact(16)
                .map(|b| b.iter().fold(0f64, |m, v| m.max(v.abs())) / 32639.0 / 2.0)
                .collect();
            (0..out)
                .map(|o| {
                    let w = &w[o * inp..][..inp];
                    let dot: f64 = w.iter().zip(row).map(|(w, x)| w * x).sum();
                    let mut bound = 0f64;
                    for (b, (wb, xb)) in w.chunks_exact(16).zip(row.chunks_exact(16)).enumerate() {
                        let wmax = wb.iter().fold(0f64, |m, v| m.max(v.abs()));
                        let xsum: f64 = xb.iter().map(|v| v.abs()).sum();
                        bound += 3e-5 * wmax * xsum;
                        if rounded {
                            bound += 1.02 * half_step[b] * wb.iter().map(|v| v.abs()).sum::<f64>();
                        }
                    }
                    (dot, bound)
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The split of rows of `x` (each a multiple of 16 values) as the kernels read it, made on the
/// host: each value within half a step of its block's `max |x| / 32639`.
fn host_split(x: &[f32]) -> Vec<u32> {
    let blocks = x.len() / 16;
    let mut words = vec![0u32; 9 * blocks];
    for (b, block) in x.chunks_exact(16).enumerate() {
        let m = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        let inv = if m > 0.0 { 32639.0 / m } else { 0.0 };
        words[8 * blocks + b] = (m / 32639.0).to_bits();
        for (i, &v) in block.iter().enumerate() {
            let u = ((v * inv).round().clamp(-32639.0, 32639.0) + 32896.0) as u32;
            let (hi, lo) = (((u >> 8) ^ 0x80) & 255, ((u & 255) ^ 0x80) & 255);
            words[4 * b + i / 4] |= hi << (8 * (i % 4));
            words[4 * blocks + 4 * b + i / 4] |= lo << (8 * (i % 4));
        }
    }
    words
}

#[test]
fn block_products_norming_their_input_match_the_f64_reference() {
    let Some(c) = client() else { return };
    // q, k and v as the 0.5B checkpoint holds them (Q5_0, with v in Q8_0 on half its layers)
    // over three rows, and as the 7B one does (Q4_K, v in Q6_K) over one, the widest part with
    // rows enough for two rows a thread; biases on all, rows of unequal magnitude.
    let eps = 1e-6f32;
    let cases = [
        (
            896usize,
            3usize,
            [
                (GgmlType::Q5_0, 40usize),
                (GgmlType::Q5_0, 24),
                (GgmlType::Q8_0, 24),
            ],
        ),
        (
            3584,
            1,
            [
                (GgmlType::Q4_K, 2056),
                (GgmlType::Q4_K, 40),
                (GgmlType::Q6_K, 24),
            ],
        ),
    ];
    for (case, (n, rows, parts)) in cases.into_iter().enumerate() {
        let seed = 100 * case as u64;
        let (x, w) = norm_rows(rows, n, seed);
        let weights: Vec<_> = parts
            .iter()
            .enumerate()
            .map(|(i, &(ty, o))| block_weight(ty, o, n, seed + 2 + i as u64))
            .collect();
        let biases: Vec<Vec<f32>> = parts
            .iter()
            .enumerate()
            .map(|(i, &(_, o))| values(o, seed + 10 + i as u64))
            .collect();
        let (xh, wh) = (upload(&c, &x), upload(&c, &w));
        let bh: Vec<Handle> = biases.iter().map(|b| upload(&c, b)).collect();
        let ys: Vec<Handle> = parts
            .iter()
            .map(|&(_, o)| upload(&c, &vec![f32::NAN; rows * o]))
            .collect();
        let products: Vec<Product> = (0..3)
            .map(|i| Product {
                weight: &weights[i].0,
                add: Addend::Bias(&bh[i]),
                y: &ys[i],
            })
            .collect();
        let input = norm_input(&xh, &wh, rows, n, eps);
        // SAFETY: the norm reads `rows` rows of `n` and `n` weights, the lengths given.
        unsafe { fused_products::<kernels::NormInput>(input, rows, &products) }.expect("launch");
        let normed = rms_norm(&x, &w, eps);
        for (i, ((weight, decoded), bias)) in weights.iter().zip(&biases).enumerate() {
            let mut want = bounds(&normed, decoded, n, true);
            for (k, (value, _)) in want.iter_mut().enumerate() {
                *value += f64::from(bias[k % weight.out_features()]);
            }
            let what = format!(
                "{} x {n}, part {i} ({})",
                weight.out_features(),
                weight.format()
            );
            assert_within(&floats(&c, &ys[i]), &want, &what);
        }
    }
}

#[test]
fn paired_block_products_and_the_staged_product_after_them_match_the_f64_reference() {
    let Some(c) = client() else { return };
    // Gate and up in the 0.5B checkpoint's Q5_0 and the 7B one's Q4_K, then a down projection
    // from their split (Q8_0 and Q6_K) adding a residual, over three rows and one.
    let eps = 1e-6f32;
    let cases = [
        (896usize, 64usize, 3usize, GgmlType::Q5_0, GgmlType::Q8_0),
        (3584, 256, 1, GgmlType::Q4_K, GgmlType::Q6_K),
    ];
    for (case, (n, inter, rows, gate_up, down_ty)) in cases.into_iter().enumerate() {
        let seed = 200 + 100 * case as u64;
        let out = 40;
        let (x, w) = norm_rows(rows, n, seed);
        let (gate, gd) = block_weight(gate_up, inter, n, seed + 2);
        let (up, ud) = block_weight(gate_up, inter, n, seed + 3);
        let (down, dd) = block_weight(down_ty, out, inter, seed + 4);
        let residual = values(rows * out, seed + 5);
        let (xh, wh, rh) = (upload(&c, &x), upload(&c, &w), upload(&c, &residual));
        let split = upload_u32(&c, &vec![0x7FC0_0000; split_words(rows, inter)]);
        let y = upload(&c, &vec![f32::NAN; rows * out]);
        let input = norm_input(&xh, &wh, rows, n, eps);
        // SAFETY: the norm reads `rows` rows of `n` and `n` weights, the lengths given.
        unsafe {
            paired_products::<kernels::NormInput, kernels::SiluMul>(input, rows, &gate, &up, &split)
        }
        .expect("launch");
        let normed = rms_norm(&x, &w, eps);
        let (g, u) = (bounds(&normed, &gd, n, true), bounds(&normed, &ud, n, true));
        let what = format!("{gate_up:?}");
        let act = assert_silu_mul(&words(&c, &split), rows * inter, &g, &u, &what);
        let product = Product {
            weight: &down,
            add: Addend::Residual(&rh),
            y: &y,
        };
        staged_product(&split, rows, product).expect("launch");
        let mut want = bounds(&act, &dd, inter, false);
        for (value, r) in want.iter_mut().zip(&residual) {
            value.0 += f64::from(*r);
        }
        assert_within(&floats(&c, &y), &want, &format!("{down_ty:?} down"));
    }
}

#[test]
fn paired_products_reading_a_split_in_place_match_the_f64_reference() {
    let Some(c) = client() else { return };
    // Gate and up over a split in memory, as a decode step at 7B runs them: 7B's Q4_K at 3584
    // over one row and three, 0.5B's Q5_0 at 896 over three, and q8 rows (each cube copies
    // the split) at 896; a row of small values among larger ones.
    let cases = [
        (3584usize, 256usize, 1usize, Some(GgmlType::Q4_K)),
        (3584, 48, 3, Some(GgmlType::Q4_K)),
        (896, 64, 3, Some(GgmlType::Q5_0)),
        (896, 32, 3, None),
    ];
    for (case, (n, inter, rows, ty)) in cases.into_iter().enumerate() {
        let seed = 900 + 10 * case as u64;
        let mut x: Vec<f32> = values(rows * n, seed).iter().map(|v| 2.0 * v).collect();
        if rows > 1 {
            x[n..2 * n].iter_mut().for_each(|v| *v *= 1e-3);
        }
        let weight = |s: u64| match ty {
            Some(ty) => block_weight(ty, inter, n, s),
            None => {
                let (w, q, scales) = q8_weight(inter, n, s);
                let deq = q
                    .iter()
                    .enumerate()
                    .map(|(i, q)| q * scales[i / n])
                    .collect();
                (w, deq)
            }
        };
        let ((gate, gd), (up, ud)) = (weight(seed + 1), weight(seed + 2));
        let input = upload_u32(&c, &host_split(&x));
        let split = upload_u32(&c, &vec![0x7FC0_0000; split_words(rows, inter)]);
        paired_split_products::<kernels::SiluMul>(&input, rows, &gate, &up, &split)
            .expect("launch");
        let act: Vec<f64> = unsplit(&host_split(&x), rows * n)
            .into_iter()
            .map(|(value, _)| value)
            .collect();
        let (g, u) = (bounds(&act, &gd, n, false), bounds(&act, &ud, n, false));
        let what = format!("{} x {n} over {rows} rows", gate.format());
        assert_silu_mul(&words(&c, &split), rows * inter, &g, &u, &what);
        let aliased = paired_split_products::<kernels::SiluMul>(&input, rows, &gate, &up, &input);
        assert!(aliased.is_err(), "{what}: the input as the output split");
    }
}

#[test]
fn staged_block_products_at_the_mlp_widths_match_the_f64_reference() {
    let Some(c) = client() else { return };
    // The down projections' widths, 0.5B's 4864 in both of its down types, 1.5B's 8960, 7B's
    // 18944 and 32B's 27648 (wider than any cube's shared memory on lavapipe: the split is read
    // in place), three rows read from a split in memory; odd row counts over 40 outputs, a
    // residual added.
    let cases = [
        (4864usize, GgmlType::Q4_K),
        (4864, GgmlType::Q6_K),
        (8960, GgmlType::Q4_K),
        (8960, GgmlType::Q6_K),
        (4864, GgmlType::Q8_0),
        (4864, GgmlType::Q5_0),
        (18944, GgmlType::Q4_K),
        (18944, GgmlType::Q6_K),
        (27648, GgmlType::Q4_K),
    ];
    let (rows, out) = (3usize, 40usize);
    for (case, (n, ty)) in cases.into_iter().enumerate() {
        let seed = 500 + 10 * case as u64;
        let mut x: Vec<f32> = values(rows * n, seed).iter().map(|v| 2.0 * v).collect();
        x[n..2 * n].iter_mut().for_each(|v| *v *= 1e-3);
        let (weight, decoded) = block_weight(ty, out, n, seed + 1);
        let residual = values(rows * out, seed + 2);
        let split = upload_u32(&c, &host_split(&x));
        let (rh, y) = (
            upload(&c, &residual),
            upload(&c, &vec![f32::NAN; rows * out]),
        );
        let product = Product {
            weight: &weight,
            add: Addend::Residual(&rh),
            y: &y,
        };
        staged_product(&split, rows, product).expect("launch");
        let act: Vec<f64> = unsplit(&host_split(&x), rows * n)
            .into_iter()
            .map(|(value, _)| value)
            .collect();
        let mut want = bounds(&act, &decoded, n, false);
        for (value, r) in want.iter_mut().zip(&residual) {
            value.0 += f64::from(*r);
        }
        assert_within(&floats(&c, &y), &want, &format!("{ty:?} x {n}"));
    }
}

#[test]
fn tiled_block_products_of_a_prompts_rows_match_the_f64_reference() {
    let Some(c) = client() else { return };
    // A prompt's products over blocks, eight rows a cube: row counts below, at and past a
    // tile's edge (a partial last tile), 38 outputs (a partial last cube), every addend, at
    // the q/k/v and o widths of 0.5B (896) and 7B (3584) and the down widths (4864, 18944).
    let cases = [
        (896usize, GgmlType::Q5_0, 7usize, "bias"),
        (896, GgmlType::Q8_0, 9, "none"),
        (896, GgmlType::Q5_0, 17, "residual"),
        (3584, GgmlType::Q4_K, 9, "none"),
        (3584, GgmlType::Q6_K, 8, "bias"),
        (4864, GgmlType::Q6_K, 9, "residual"),
        (18944, GgmlType::Q4_K, 3, "residual"),
    ];
    let out = 38usize;
    for (case, (n, ty, rows, add)) in cases.into_iter().enumerate() {
        let seed = 700 + 10 * case as u64;
        let mut x: Vec<f32> = values(rows * n, seed).iter().map(|v| 2.0 * v).collect();
        x[n..2 * n].iter_mut().for_each(|v| *v *= 1e-3);
        let (weight, decoded) = block_weight(ty, out, n, seed + 1);
        let addend = match add {
            "bias" => values(out, seed + 2),
            "residual" => values(rows * out, seed + 2),
            _ => vec![0.0; rows * out],
        };
        let split = upload_u32(&c, &host_split(&x));
        let (ah, y) = (upload(&c, &addend), upload(&c, &vec![f32::NAN; rows * out]));
        let product = Product {
            weight: &weight,
            add: match add {
                "bias" => Addend::Bias(&ah),
                "residual" => Addend::Residual(&ah),
                _ => Addend::None,
            },
            y: &y,
        };
        products(&split, rows, &[product]).expect("launch");
        let act: Vec<f64> = unsplit(&host_split(&x), rows * n)
            .into_iter()
            .map(|(value, _)| value)
            .collect();
        let mut want = bounds(&act, &decoded, n, false);
        for (i, value) in want.iter_mut().enumerate() {
            value.0 += f64::from(addend[if add == "bias" { i % out } else { i }]);
        }
        assert_within(
            &floats(&c, &y),
            &want,
            &format!("{ty:?} x {n}, {rows} rows"),
        );
    }
}

#[test]
fn matrix_products_of_a_prompts_rows_match_the_f64_reference() {
    let Some(c) = client() else { return };
    // A prompt's products through f16 matrices (the matrix units' path; on a device without
    // them the same conversions around a unit matmul): every block type and q8, row counts
    // that fill no tile of 16, 36 outputs, every addend, two and three products sharing the
    // rows' conversion, at the widths of 0.5B (896, 4864) and 7B (3584, 18944).
    let cases = [
        (
            896usize,
            &[GgmlType::Q5_0, GgmlType::Q5_0, GgmlType::Q8_0][..],
            7usize,
            "bias",
        ),
        (896, &[GgmlType::Q8_0][..], 17, "residual"),
        (3584, &[GgmlType::Q4_K, GgmlType::Q4_K][..], 9, "none"),
        (3584, &[GgmlType::Q6_K][..], 33, "bias"),
        (4864, &[GgmlType::Q6_K][..], 5, "residual"),
        (18944, &[GgmlType::Q4_K][..], 3, "residual"),
    ];
    let out = 36usize;
    let scratch = MatrixScratch::new(&c, 40, 18944, 64, 36 * 18944);
    for (case, (n, types, rows, add)) in cases.into_iter().enumerate() {
        let seed = 1700 + 10 * case as u64;
        let mut x: Vec<f32> = values(rows * n, seed).iter().map(|v| 2.0 * v).collect();
        x[n..2 * n].iter_mut().for_each(|v| *v *= 1e-3);
        // A row past f16's range (65504), as a 7B's `silu(gate) * up` can be.
        x[2 * n..3 * n].iter_mut().for_each(|v| *v *= 1e5);
        let mut weights: Vec<(DirectWeight, Vec<f64>)> = types
            .iter()
            .enumerate()
            .map(|(i, &ty)| block_weight(ty, out, n, seed + 1 + i as u64))
            .collect();
        if case == 1 {
            // A q8 weight beside the blocks (the q8 store's prompts take this path too).
            let (w, q, s) = q8_weight(out, n, seed + 5);
            let decoded = q.iter().enumerate().map(|(i, v)| v * s[i / n]).collect();
            weights.push((w, decoded));
        }
        let addend = match add {
            "bias" => values(out, seed + 2),
            "residual" => values(rows * out, seed + 2),
            _ => vec![0.0; rows * out],
        };
        let split = upload_u32(&c, &host_split(&x));
        let ah = upload(&c, &addend);
        let ys: Vec<Handle> = weights
            .iter()
            .map(|_| upload(&c, &vec![f32::NAN; rows * out]))
            .collect();
        let parts: Vec<Product> = weights
            .iter()
            .zip(&ys)
            .map(|((weight, _), y)| Product {
                weight,
                add: match add {
                    "bias" => Addend::Bias(&ah),
                    "residual" => Addend::Residual(&ah),
                    _ => Addend::None,
                },
                y,
            })
            .collect();
        matrix_products(&split, rows, &parts, &scratch).expect("launch");
        let act: Vec<f64> = unsplit(&host_split(&x), rows * n)
            .into_iter()
            .map(|(value, _)| value)
            .collect();
        for ((weight, decoded), y) in weights.iter().zip(&ys) {
            let want = matrix_bounds(&act, decoded, n, out, &addend, add == "bias");
            let what = format!("{} x {n}, {rows} rows, matrix units", weight.format());
            assert_within(&floats(&c, y), &want, &what);
        }
    }
}

/// The f64 product with its bound for [`matrix_products`]: each input (over its row's largest)
/// and weight rounded to f16, half an ulp (2^-11 of the value) or half the subnormal step, the
/// sums in f32; the addend one per column (`bias`) or per element.
fn matrix_bounds(
    act: &[f64],
    decoded: &[f64],
    n: usize,
    out: usize,
    addend: &[f32],
    bias: bool,
) -> Vec<(f64, f64)> {
    let mut want = bounds(act, decoded, n, false);
    for (i, value) in want.iter_mut().enumerate() {
        let (r, o) = (i / out, i % out);
        let (row, w) = (&act[r * n..][..n], &decoded[o * n..][..n]);
        let top = row.iter().fold(0f64, |m, x| m.max(x.abs()));
        let mag: f64 = row.iter().zip(w).map(|(x, w)| (x * w).abs()).sum();
        let tiny: f64 = row
            .iter()
            .zip(w)
            .map(|(x, w)| top * w.abs() + x.abs())
            .sum();
        value.1 += (2.0 * 2f64.powi(-11) + 3e-5) * mag + 2f64.powi(-25) * tiny;
        value.0 += f64::from(addend[if bias { o } else { i }]);
    }
    want
}

#[test]
fn a_matrix_product_past_one_grid_dimension_matches_the_f64_reference() {
    let Some(c) = client() else { return };
    // More outputs than 65535 cubes of 256 hold (a 7B MLP product of 886 rows or more): the
    // finishing kernel's grid takes a row a grid row. Narrow rows keep the reference quick.
    let (rows, n, out) = (260usize, 32usize, 65532usize);
    assert!(rows * out > 65535 * 256);
    let x = values(rows * n, 1801);
    let (weight, decoded) = block_weight(GgmlType::Q8_0, out, n, 1802);
    let addend = values(rows * out, 1803);
    let scratch = MatrixScratch::new(&c, rows, n, out, out * n);
    let split = upload_u32(&c, &host_split(&x));
    let ah = upload(&c, &addend);
    let y = upload(&c, &vec![f32::NAN; rows * out]);
    let part = Product {
        weight: &weight,
        add: Addend::Residual(&ah),
        y: &y,
    };
    matrix_products(&split, rows, &[part], &scratch).expect("launch");
    let act: Vec<f64> = unsplit(&host_split(&x), rows * n)
        .into_iter()
        .map(|(value, _)| value)
        .collect();
    let want = matrix_bounds(&act, &decoded, n, out, &addend, false);
    assert_within(&floats(&c, &y), &want, "Q8_0 x 32, 260 rows of 65532");
}

#[test]
fn a_prompts_gate_and_up_rows_join_into_the_down_projections_split() {
    let Some(c) = client() else { return };
    // 9 rows of 0.5B's MLP width: the tiled prefill's `silu(gate) * up`, split.
    let (rows, n) = (9usize, 4864usize);
    let g: Vec<f32> = values(rows * n, 31).iter().map(|v| 6.0 * v).collect();
    let u: Vec<f32> = values(rows * n, 32).iter().map(|v| 3.0 * v).collect();
    let blocks = rows * n / 16;
    let split = upload_u32(&c, &vec![0u32; split_words(rows, n)]);
    // SAFETY: `g` and `u` hold `rows * n` f32, the split `9 * blocks` words; one thread a block.
    unsafe {
        kernels::silu_mul_split_kernel::launch_unchecked(
            &c,
            CubeCount::Static(blocks.div_ceil(THREADS) as u32, 1, 1),
            CubeDim::new_1d(THREADS as u32),
            BufferArg::from_raw_parts(upload(&c, &g), rows * n / 4),
            BufferArg::from_raw_parts(upload(&c, &u), rows * n / 4),
            BufferArg::from_raw_parts(split.clone(), 2 * blocks),
            BufferArg::from_raw_parts(split.clone(), 9 * blocks),
            blocks,
        );
    }
    let exact = |v: &[f32]| v.iter().map(|&v| (f64::from(v), 0.0)).collect::<Vec<_>>();
    assert_silu_mul(
        &words(&c, &split),
        rows * n,
        &exact(&g),
        &exact(&u),
        "9 rows",
    );
}

#[test]
fn looked_up_block_rows_are_the_rows_the_reader_decodes() {
    let Some(c) = client() else { return };
    // The 0.5B checkpoint's embedding type at its width, the 7B one's at its; ids read from the
    // second on, the last past the matrix (its row is left as it was).
    for (ty, n) in [(GgmlType::Q5_0, 896usize), (GgmlType::Q4_K, 3584)] {
        let rows = 50;
        let (weight, decoded) = block_weight(ty, rows, n, 900 + n as u64);
        let ids = [3u32, 7, 49, 0, rows as u32];
        let (idh, pos) = (upload_u32(&c, &ids), upload_u32(&c, &[1]));
        let out = upload(&c, &vec![f32::NAN; 4 * n]);
        // SAFETY: `pos[0] + 4 == ids.len()`; `out` is a buffer of its own.
        unsafe { lookup_rows(&weight, &idh, ids.len(), &pos, 4, &out) }.expect("launch");
        let got = floats(&c, &out);
        for (t, &id) in ids[1..].iter().enumerate() {
            let row = &got[t * n..][..n];
            if id as usize >= rows {
                assert!(
                    row.iter().all(|v| v.is_nan()),
                    "{ty:?}: id {id} wrote its row"
                );
                continue;
            }
            let want = &decoded[id as usize * n..][..n];
            for (i, (&g, &w)) in row.iter().zip(want).enumerate() {
                // `a * q - m` in f32 against the reader's own order of the same operations.
                let bound = 1e-6
                    * want[i / 16 * 16..][..16]
                        .iter()
                        .fold(0f64, |m, v| m.max(v.abs()));
                assert!(
                    (f64::from(g) - w).abs() <= bound,
                    "{ty:?} row {id}[{i}]: {g} against {w}"
                );
            }
        }
    }
}
