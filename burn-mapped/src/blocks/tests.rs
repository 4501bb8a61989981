//! Every inner loop this CPU has, held to the f64 definition of the product on edge shapes.
//!
//! The reference dequantizes the weights with the GGUF reader's own decoder and works in
//! f64; the kernels share none of its code.

use burn::tensor::{DType, Device, Int, Tensor, TensorData, f16};

use super::act::{self, ACT_BLOCK};
use super::kernel::Isa;
use super::weight::products;
use super::{BlockInput, BlockLayout, BlockWeight};
use crate::gguf::format::scale_offsets;
use crate::gguf::{GgmlType, dequantize_to_vec};

const KINDS: [GgmlType; 4] = [
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];

/// splitmix64: deterministic data without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// Random blocks with scale `scale` (so magnitudes stay meaningful), row `zero_row` all zeros.
fn blocks(
    ty: GgmlType,
    rows: usize,
    cols: usize,
    scale: f32,
    zero_row: Option<usize>,
    rng: &mut Rng,
) -> Vec<u8> {
    let layout = BlockLayout::new(ty, cols).unwrap();
    let mut bytes: Vec<u8> = (0..rows * layout.row_bytes())
        .map(|_| rng.next() as u8)
        .collect();
    let bb = ty.type_size() as usize;
    for block in bytes.chunks_exact_mut(bb) {
        for &at in scale_offsets(ty) {
            let s = scale * (0.5 + 0.5 * rng.unit().abs());
            block[at..at + 2].copy_from_slice(&f16::from_f32(s).to_bits().to_le_bytes());
        }
    }
    if let Some(r) = zero_row {
        bytes[r * layout.row_bytes()..(r + 1) * layout.row_bytes()].fill(0);
    }
    bytes
}

/// `y[t, o] = sum_i w[o, i] * a[t, i]` in f64, with `a` the packed activations dequantized.
fn reference(
    ty: GgmlType,
    w: &[u8],
    out: usize,
    cols: usize,
    packed: &[u8],
    t: usize,
    bias: &[f32],
) -> Vec<f64> {
    let w = dequantize_to_vec(ty, w).unwrap();
    assert_eq!(w.len(), out * cols);
    let row = act::row_bytes(cols);
    let a: Vec<f64> = packed
        .chunks_exact(row)
        .flat_map(|r| {
            let d: Vec<f32> = r[cols..cols + cols / 8]
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            (0..cols).map(move |i| f64::from(r[i] as i8) * f64::from(d[i / ACT_BLOCK]))
        })
        .collect();
    let mut y = vec![0f64; t * out];
    for tt in 0..t {
        for o in 0..out {
            let s: f64 = (0..cols)
                .map(|i| f64::from(w[o * cols + i]) * a[tt * cols + i])
                .sum();
            y[tt * out + o] = s + f64::from(bias[o]);
        }
    }
    y
}

fn check(ty: GgmlType, out: usize, cols: usize, t: usize, scale: f32, seed: u64) {
    let mut rng = Rng(seed);
    let w = blocks(ty, out, cols, scale, Some(out / 2), &mut rng);
    let x: Vec<f32> = (0..t * cols)
        .map(|i| {
            if i % cols < ACT_BLOCK && i / cols == 0 {
                0.0
            } else {
                rng.unit() * 3.0
            }
        })
        .collect();
    let bias: Vec<f32> = (0..out).map(|_| rng.unit()).collect();
    check_with(ty, &w, out, cols, &x, t, &bias, &format!("scale {scale}"));
}

/// Every loop's `x W^T + bias` for the blocks `w` (`[out, cols]` of `ty`) against the f64
/// definition.
#[allow(clippy::too_many_arguments)]
fn check_with(
    ty: GgmlType,
    w: &[u8],
    out: usize,
    cols: usize,
    x: &[f32],
    t: usize,
    bias: &[f32],
    what: &str,
) {
    let device = Device::flex();
    let layout = BlockLayout::new(ty, cols).unwrap();
    let weight = BlockWeight::new(
        Tensor::<2, Int>::from_data(
            TensorData::new(w.to_vec(), [out, layout.row_bytes()]),
            (&device, DType::U8),
        ),
        layout,
    )
    .unwrap();
    let input = BlockInput::new(Tensor::<2>::from_data(
        TensorData::new(x.to_vec(), [t, cols]),
        &device,
    ))
    .unwrap();
    let packed = act::quantize(x, t, cols);
    let expected = reference(ty, w, out, cols, &packed, t, bias);
    let magnitude = {
        let w = dequantize_to_vec(ty, w).unwrap();
        let xmax = x.iter().map(|v| f64::from(v.abs())).fold(0.0, f64::max);
        w.iter().map(|v| f64::from(v.abs())).fold(0.0, f64::max) * xmax * cols as f64
    };
    for isa in Isa::available() {
        let b = Tensor::<1>::from_data(TensorData::new(bias.to_vec(), [out]), &device);
        let y = products(&input, &[(&weight, Some(b))], isa)
            .unwrap()
            .pop()
            .unwrap();
        assert_eq!(y.dims(), [t, out]);
        let y = y.into_data().try_to_vec::<f32>().unwrap();
        for (i, (&got, &want)) in y.iter().zip(&expected).enumerate() {
            let tol = 1e-5 * magnitude + 1e-6;
            assert!(
                (f64::from(got) - want).abs() <= tol,
                "{} {} [{out}x{cols}] T={t} {what}: y[{}, {}] = {got}, f64 {want} (tol {tol})",
                ty.name(),
                isa.name(),
                i / out,
                i % out
            );
        }
    }
}

#[test]
fn every_kind_and_loop_matches_the_f64_definition_on_edge_shapes() {
    for ty in KINDS {
        let b = ty.block_size() as usize;
        // 1, 2, 3, 5 and 19 blocks per row (odd and even counts, the kernels' tails),
        // every tile size, and tiles after a full one.
        for (k, cols) in [b, 2 * b, 3 * b, 5 * b, 19 * b].into_iter().enumerate() {
            // Decode's tiles (1-9 rows) and a prompt's lane groups (16 rows on): full
            // groups, a partial last one, and more groups than one step takes.
            for t in (1..=9).chain([15, 16, 17, 23, 40]) {
                check(ty, 5, cols, t, 0.01, (k * 100 + t) as u64);
            }
        }
        // Extreme scales: the largest f16, and one near the bottom of its normal range.
        check(ty, 3, b, 2, 60000.0, 7);
        check(ty, 3, b, 2, 1e-4, 8);
    }
}

/// The extreme values of each type (every value bit set, every one clear, and Q8_0's -128 and
/// 127), against activations at the largest quantized magnitude (127) of one sign, the other,
/// and alternating: the integer sums and the offsets folded into them reach their extremes.
#[test]
fn extreme_values_match_the_definition() {
    for ty in KINDS {
        let b = ty.block_size() as usize;
        let (out, cols, t) = (4, 3 * b, 3);
        let layout = BlockLayout::new(ty, cols).unwrap();
        let bb = ty.type_size() as usize;
        // Row 0: every value bit set; row 1: every value bit clear; rows 2-3: bytes 0x80 and
        // 0x7F (Q8_0's extremes -128 and 127; any pattern for the others).
        let mut w = Vec::with_capacity(out * layout.row_bytes());
        for fill in [0xFFu8, 0x00, 0x80, 0x7F] {
            w.extend(std::iter::repeat_n(fill, layout.row_bytes()));
        }
        for (k, block) in w.chunks_exact_mut(bb).enumerate() {
            for &at in scale_offsets(ty) {
                let s = f16::from_f32(if k % 2 == 0 { 0.02 } else { -0.015 });
                block[at..at + 2].copy_from_slice(&s.to_bits().to_le_bytes());
            }
        }
        let x: Vec<f32> = (0..t * cols)
            .map(|i| match i / cols {
                0 => 1.0,
                1 => -1.0,
                _ => {
                    if i % 2 == 0 {
                        1.0
                    } else {
                        -1.0
                    }
                }
            })
            .collect();
        check_with(ty, &w, out, cols, &x, t, &[0.5; 4], "extremes");
    }
}

/// A prompt's product at a model's widths (Qwen2.5-0.5B's hidden size and feed-forward
/// width): 481 rows in lane groups, more than one token block where the input is wide.
#[test]
fn a_prompt_at_model_widths_matches_the_definition() {
    for (ty, out, cols, seed) in [
        (GgmlType::Q5_0, 19, 896, 21),
        (GgmlType::Q8_0, 13, 896, 22),
        (GgmlType::Q4_K, 11, 4864, 23),
        (GgmlType::Q6_K, 9, 4864, 24),
    ] {
        check(ty, out, cols, 481, 0.02, seed);
    }
}

#[test]
fn a_matrix_split_across_threads_matches_the_definition() {
    // ~330 KB of Q8_0 blocks: more than one thread's minimum slab.
    check(GgmlType::Q8_0, 600, 512, 3, 0.02, 11);
    check(GgmlType::Q6_K, 300, 1024, 1, 0.02, 12);
    // An odd number of rows, cut into slabs of different lengths.
    check(GgmlType::Q5_0, 1001, 384, 1, 0.02, 13);
    // And a prompt's: slabs of rows that are not a multiple of a step's.
    check(GgmlType::Q5_0, 1001, 384, 33, 0.02, 14);
}

/// The packed format is its definition: a scale per 32 of `absmax / 127`, values rounded
/// half away from zero, sums of 16.
#[test]
fn activations_quantize_as_defined() {
    let mut rng = Rng(3);
    let (t, cols) = (2, 64);
    let mut x: Vec<f32> = (0..t * cols).map(|_| rng.unit() * 5.0).collect();
    x[32..64].fill(0.0);
    x[64] = -7.5;
    let packed = act::quantize(&x, t, cols);
    let row = act::row_bytes(cols);
    assert_eq!(packed.len(), t * row);
    for (tt, r) in packed.chunks_exact(row).enumerate() {
        for b in 0..cols / ACT_BLOCK {
            let xs = &x[tt * cols + b * 32..tt * cols + b * 32 + 32];
            let amax = xs.iter().map(|v| f64::from(v.abs())).fold(0.0, f64::max);
            let d = f32::from_le_bytes(r[cols + 4 * b..cols + 4 * b + 4].try_into().unwrap());
            assert_eq!(f64::from(d), f64::from((amax / 127.0) as f32));
            for (i, &v) in xs.iter().enumerate() {
                let want = if amax == 0.0 {
                    0.0
                } else {
                    (f64::from(v) * 127.0 / amax).round()
                };
                let got = f64::from(r[b * 32 + i] as i8);
                assert!(
                    (got - want).abs() <= 1.0 && (got - want).abs() < 0.5 + 1e-3 || got == want,
                    "t {tt} block {b} value {i}: {got} vs {want}"
                );
            }
        }
        for k in 0..cols / 16 {
            let s: i32 = (0..16).map(|i| i32::from(r[16 * k + i] as i8)).sum();
            let at = cols + cols / 8 + 2 * k;
            assert_eq!(i32::from(i16::from_le_bytes([r[at], r[at + 1]])), s);
        }
    }
}

/// Products sharing one input run as one set of slabs, whose cuts fall inside and across the
/// products: each result is still its own product's.
#[test]
fn products_over_one_input_each_match_their_own_definition() {
    let mut rng = Rng(21);
    let device = Device::flex();
    let (cols, t) = (512, 2);
    // ~330 KB in all: cut into slabs that straddle the products' boundaries.
    let shapes = [
        (GgmlType::Q5_0, 300),
        (GgmlType::Q8_0, 7),
        (GgmlType::Q6_K, 250),
        (GgmlType::Q4_K, 40),
    ];
    let x: Vec<f32> = (0..t * cols).map(|_| rng.unit() * 2.0).collect();
    let input = BlockInput::new(Tensor::<2>::from_data(
        TensorData::new(x.clone(), [t, cols]),
        &device,
    ))
    .unwrap();
    let packed = act::quantize(&x, t, cols);
    let mut weights = Vec::new();
    let mut expected = Vec::new();
    for &(ty, out) in &shapes {
        let layout = BlockLayout::new(ty, cols).unwrap();
        let w = blocks(ty, out, cols, 0.02, None, &mut rng);
        expected.push(reference(ty, &w, out, cols, &packed, t, &vec![0.0; out]));
        weights.push(
            BlockWeight::new(
                Tensor::<2, Int>::from_data(
                    TensorData::new(w, [out, layout.row_bytes()]),
                    (&device, DType::U8),
                ),
                layout,
            )
            .unwrap(),
        );
    }
    let layers: Vec<_> = weights.iter().map(|w| (w, None)).collect();
    for isa in Isa::available() {
        let ys = products(&input, &layers, isa).unwrap();
        for ((y, want), &(ty, out)) in ys.into_iter().zip(&expected).zip(&shapes) {
            assert_eq!(y.dims(), [t, out]);
            let y: Vec<f32> = y.into_data().try_to_vec().unwrap();
            let scale = want.iter().map(|v| v.abs()).fold(1.0, f64::max);
            for (i, (&got, &w)) in y.iter().zip(want).enumerate() {
                assert!(
                    (f64::from(got) - w).abs() <= 1e-5 * scale,
                    "{} {}: y[{i}] = {got}, f64 {w}",
                    ty.name(),
                    isa.name()
                );
            }
        }
    }
}
