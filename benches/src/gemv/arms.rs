//! The arms: what one pass of each enqueues, and the arms that need more than
//! [`measure`] around a pass (graph replays, Burn's float and int8 matmuls).

use anyhow::{Result, bail};
use burn::tensor::quantization::QuantScheme;
use burn::tensor::{DType, Device, Tensor};
use burn_mapped::MappedStore;
use burn_mapped::q8::{Q8Input, Q8Weight, Tuning, q8_linear, q8_linear_input};

use super::args::Args;
use super::setup::{Rng, float_weight, random_x};
use super::timing::{ArmResult, Timing, measure};

/// One pass of q8 products of `x` over every weight: each through [`q8_linear`], or
/// (`shared`: an input prepared with `tuning`) all on one [`Q8Input`], whose activation split
/// (dp4a kernel) they share.
pub fn q8_pass(
    x: &Tensor<2>,
    weights: &[Q8Weight],
    shared: Option<Tuning>,
) -> Result<Vec<Tensor<2>>> {
    let input = shared
        .map(|tuning| Q8Input::with_tuning(x.clone(), tuning))
        .transpose()?;
    Ok(weights
        .iter()
        .map(|w| match &input {
            Some(input) => q8_linear_input(input, w, None),
            None => q8_linear(x.clone(), w, None),
        })
        .collect::<Result<Vec<_>, _>>()?)
}

/// A pass of `arm` (`q8graph`, or `q8sharedgraph` with `shared`) at `t` captured once with
/// Burn's graph capture and replayed: the recorded launches are re-encoded from prebuilt
/// state, without the per-launch host work of Burn's dispatch, Fusion and CubeCL's launch
/// path. Returns the arm (`None` where the device does not capture graphs) and whether the
/// replayed outputs equal a fresh eager product (`Err` if they differ); `label` names the
/// launch shape in the check.
#[allow(clippy::too_many_arguments)]
pub fn replay_arm(
    arm: &str,
    t: usize,
    x: &Tensor<2>,
    weights: &[Q8Weight],
    shared: Option<Tuning>,
    a: &Args,
    timing: &Timing,
    label: &str,
) -> Result<Option<(ArmResult, String)>> {
    let dev = x.device();
    let q8_bytes: u64 = weights.iter().map(|w| w.bytes() as u64).sum();
    let mut graph = burn::tensor::capture(&dev, || q8_pass(x, weights, shared));
    if !graph.is_hardware() {
        return Ok(None);
    }
    graph
        .output()
        .as_ref()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let replay = || {
        // SAFETY: the graph reads the weights and `x` and writes its own outputs, all alive
        // until it is dropped at the end of this function (`x` is borrowed for longer); nothing
        // else uses them meanwhile, and every replay is followed by a sync on this thread's
        // stream before the next.
        unsafe { graph.replay() };
        Ok(())
    };
    let r = measure(arm, t, weights.len(), q8_bytes, a, timing, replay)?;
    // The replays rewrote the captured outputs; they must equal a fresh eager product.
    let replayed = graph
        .output()
        .as_ref()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let same = q8_pass(x, weights, shared)?
        .into_iter()
        .zip(replayed)
        .all(|(e, y)| e.into_data() == y.clone().into_data());
    if !same {
        bail!("{arm} {label} T={t}: replayed outputs differ from the eager product");
    }
    Ok(Some((
        r,
        format!("{arm} {label} T={t}: replayed outputs equal eager: {same}"),
    )))
}

/// Times `x @ w^T` over every `w` (one pass), or `None` when the first product panics (an op
/// this device's backend lacks).
pub fn matmul_arm(
    arm: &str,
    ws: &[Tensor<2>],
    x: &Tensor<2>,
    bytes: u64,
    a: &Args,
    timing: &Timing,
) -> Result<Option<ArmResult>> {
    let probe = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = x.clone().matmul(ws[0].clone().transpose()).into_data();
    }));
    if probe.is_err() {
        return Ok(None);
    }
    measure(arm, 1, ws.len(), bytes, a, timing, || {
        Ok(ws
            .iter()
            .map(|w| x.clone().matmul(w.clone().transpose()))
            .collect::<Vec<Tensor<2>>>())
    })
    .map(Some)
}

/// Burn's float matmul in `dtype` (`size` bytes per weight) at `T = 1` on the dequantized
/// weights; for f32 also the largest error of `q8` (`weights[0]`) relative to it. `Ok(None)`
/// arm with a reason where the device lacks the dtype or the op.
#[allow(clippy::too_many_arguments)]
pub fn float_arm(
    arm: &str,
    (dtype, size): (DType, u64),
    store: &MappedStore,
    q8: &Q8Weight,
    rng: &mut Rng,
    dev: &Device,
    a: &Args,
    timing: &Timing,
) -> Result<(Result<ArmResult, String>, Option<f64>)> {
    if !dev.supports_dtype(dtype) {
        return Ok((
            Err(format!("{arm}: device does not support {dtype:?}")),
            None,
        ));
    }
    let n = a.float_matrices();
    let ws = (0..n)
        .map(|k| {
            let w = float_weight(store, k, a, dev)?;
            Ok(if dtype == DType::F32 {
                w
            } else {
                w.cast(dtype)
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let x = random_x(rng, 1, a.inp, dev).cast(dtype);
    let check = if dtype == DType::F32 {
        let want: Vec<f32> = x
            .clone()
            .matmul(ws[0].clone().transpose())
            .into_data()
            .try_to_vec()
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let got: Vec<f32> = q8_linear(x.clone(), q8, None)?
            .into_data()
            .try_to_vec()
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let scale = want.iter().fold(0f64, |m, v| m.max(f64::from(v.abs())));
        let err = got
            .iter()
            .zip(&want)
            .fold(0f64, |m, (g, w)| m.max(f64::from((g - w).abs())));
        Some(err / scale)
    } else {
        None
    };
    let bytes = n as u64 * (a.out * a.inp) as u64 * size;
    let r = matmul_arm(arm, &ws, &x, bytes, a, timing)?
        .ok_or_else(|| format!("{arm}: matmul panicked on this device"));
    Ok((r, check))
}

/// Burn's own int8 quantization (its default scheme: symmetric, one f32 scale per tensor,
/// values packed four per u32) of the same dequantized weights, multiplied by whatever Burn's
/// matmul does with a quantized right-hand side on this device, at `T = 1`.
pub fn burnq8_arm(
    store: &MappedStore,
    rng: &mut Rng,
    dev: &Device,
    a: &Args,
    timing: &Timing,
) -> Result<Result<ArmResult, String>> {
    let n = a.float_matrices();
    let scheme = QuantScheme::default();
    let ws = (0..n)
        .map(|k| Ok(float_weight(store, k, a, dev)?.quantize_dynamic(&scheme)))
        .collect::<Result<Vec<_>>>()?;
    let x = random_x(rng, 1, a.inp, dev);
    let bytes = n as u64 * (a.out * a.inp) as u64;
    Ok(matmul_arm("burnq8", &ws, &x, bytes, a, timing)?
        .ok_or_else(|| "burnq8: Burn's quantized matmul panicked on this device".to_string()))
}
