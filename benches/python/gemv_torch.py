#!/usr/bin/env python3
"""PyTorch arms of the GEMV benchmark, under the protocol of `benches/src/bin/gemv.rs`.

The paper's matched protocol (section 3.1): one pass = one product over each of `--matrices`
distinct `[out, in]` matrices (default 12 x 12288 x 7168, 88.1 MB each as int8) followed by one
`torch.cuda.synchronize()`. `--warmup` passes (12) are discarded, then `--passes` (30) are timed
one by one with the wall clock, as the Rust program times its passes. The report gives the
median and the min/max; GB/s counts each arm's weight bytes once per pass. Each arm then runs
as many passes again between two CUDA events recorded around the pass's launches and reports
their median as `device_ms`: the device's own time per pass, beside the Rust program's
`--device-time`.

Arms (weights resident on the GPU, activations random and never zero):

- `read`: the int8 values viewed as int32 and summed per matrix (a PyTorch reduction): the
  read ceiling over the same bytes. Bytes: `out * in` per matrix.
- `readf32`: the same bytes viewed as float32 and summed (the values are meaningless; PyTorch's
  float reduction is its fastest read of a buffer, so this is the device's own read ceiling as
  PyTorch reaches it). Bytes: `out * in` per matrix.
- `fp16`: `F.linear(x, W)` with `x` fp16 `[T, in]` and `W` fp16 `[out, in]` (cuBLAS).
  Bytes: `2 * out * in`.
- `int8pack`: `torch._weight_int8pack_mm(x, q, scales)` with `x` fp16 `[T, in]`, `q` int8
  `[out, in]` and one fp16 scale per output row: PyTorch's int8 weight-only matmul, on the same
  bytes as our q8 format. Bytes: `out * (in + 2)`.

`fp16` and `int8pack` run at every `T` of `--t-sweep` (1,2,4,8). Before timing, each product
arm is checked on the first matrix against an fp32 product of the dequantized weights.

    python3 benches/python/gemv_torch.py [--matrices 12] [--out 12288] [--in 7168]
        [--passes 30] [--warmup 12] [--t-sweep 1,2,4,8] [--arms read,readf32,fp16,int8pack]
        [--json FILE]

Needs PyTorch with CUDA; exits with status 2 and says so otherwise. `--self-check` runs the
parts that need no GPU (argument parsing, statistics, the table) and needs no PyTorch. An arm
that fails (e.g. an operator this PyTorch lacks on CUDA) is reported in `skipped` and makes
the exit status 3; the other arms still run.
"""

import argparse
import json
import sys
import time

ARMS = ("read", "readf32", "fp16", "int8pack")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--matrices", type=int, default=12)
    p.add_argument("--out", type=int, default=12288)
    p.add_argument("--in", dest="inp", type=int, default=7168)
    p.add_argument("--passes", type=int, default=30)
    p.add_argument("--warmup", type=int, default=12)
    p.add_argument("--t-sweep", default="1,2,4,8")
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--seed", type=int, default=0x2545F491)
    p.add_argument("--json", default=None, help="write the report here instead of stdout")
    p.add_argument("--self-check", action="store_true", help="check the GPU-free parts only")
    a = p.parse_args(argv)
    try:
        a.t_sweep = [int(t) for t in a.t_sweep.split(",")]
    except ValueError:
        p.error(f"--t-sweep: `{a.t_sweep}` is not a comma-separated list of integers")
    a.arms = [s for s in a.arms.split(",") if s]
    unknown = [s for s in a.arms if s not in ARMS]
    if unknown:
        p.error(f"--arms: unknown arm(s) {unknown} (known: {', '.join(ARMS)})")
    if min(a.matrices, a.out, a.inp, a.passes) <= 0 or a.warmup < 0:
        p.error("--matrices, --out, --in and --passes must be positive, --warmup >= 0")
    if any(t <= 0 for t in a.t_sweep):
        p.error("--t-sweep: T must be positive")
    return a


def arm_bytes(arm, out, inp):
    """Weight bytes one product of `arm` reads from one matrix."""
    return {
        "read": out * inp,
        "readf32": out * inp,
        "fp16": 2 * out * inp,
        "int8pack": out * (inp + 2),
    }[arm]


def median(values):
    """Median as the Rust program takes it: of an even count, the mean of the middle two."""
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 == 1 else (s[n // 2 - 1] + s[n // 2]) / 2


def summarize(arm, t, matrices, bytes_per_pass, times):
    """The Rust program's result record for pass times `times` (seconds)."""
    s = sorted(times)
    n = len(s)
    mid = median(s)
    gbps = lambda sec: bytes_per_pass / sec / 1e9  # noqa: E731
    return {
        "arm": arm,
        "t": t,
        "matrices": matrices,
        "bytes_per_pass": bytes_per_pass,
        "passes": n,
        "median_ms": mid * 1e3,
        "min_ms": s[0] * 1e3,
        "max_ms": s[-1] * 1e3,
        "gbps_median": gbps(mid),
        "gbps_best": gbps(s[0]),
        "gbps_worst": gbps(s[-1]),
    }


def table(results):
    """The table the Rust program prints, one row per result."""
    lines = [
        "| arm      | T  | matrices | MB/pass | median ms | min ms | max ms | GB/s (median) | GB/s (best) |",
        "|----------|----|----------|---------|-----------|--------|--------|---------------|-------------|",
    ]
    for r in results:
        lines.append(
            f"| {r['arm']:<8} | {r['t']:<2} | {r['matrices']:<8} | {r['bytes_per_pass'] / 1e6:>7.1f} "
            f"| {r['median_ms']:>9.3f} | {r['min_ms']:>6.3f} | {r['max_ms']:>6.3f} "
            f"| {r['gbps_median']:>13.2f} | {r['gbps_best']:>11.2f} |"
        )
    return "\n".join(lines)


def self_check():
    a = parse_args(["--t-sweep", "1,8", "--arms", "fp16,read", "--matrices", "2"])
    assert a.t_sweep == [1, 8] and a.arms == ["fp16", "read"] and a.matrices == 2
    # Median of an even count is the mean of the middle two, as in the Rust program.
    r = summarize("read", 0, 2, 4_000_000, [0.004, 0.001, 0.003, 0.002])
    assert abs(r["median_ms"] - 2.5) < 1e-9, r
    assert median([3.0, 1.0, 2.0]) == 2.0 and median([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert r["min_ms"] == 1.0 and r["max_ms"] == 4.0, r
    assert abs(r["gbps_best"] - 4.0) < 1e-9 and abs(r["gbps_worst"] - 1.0) < 1e-9, r
    assert arm_bytes("int8pack", 3, 8) == 30 and arm_bytes("fp16", 3, 8) == 48
    print(table([r]))
    print("self-check passed")


def main():
    a = parse_args()
    if a.self_check:
        self_check()
        return 0
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        print(f"gemv_torch: PyTorch is not installed ({e}); this script needs PyTorch with CUDA",
              file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print(f"gemv_torch: CUDA is not available to PyTorch {torch.__version__} "
              f"(torch.version.cuda = {torch.version.cuda}); this script needs a CUDA GPU",
              file=sys.stderr)
        return 2

    dev = torch.device("cuda")
    g = torch.Generator(device=dev)
    g.manual_seed(a.seed)
    sync = torch.cuda.synchronize

    def nonzero(shape, dtype):
        """Magnitudes in [0.1, 1) with random signs: never zero."""
        m = 0.1 + 0.9 * torch.rand(shape, generator=g, device=dev)
        sign = torch.randint(0, 2, shape, generator=g, device=dev) * 2 - 1
        return (m * sign).to(dtype)

    # Same format as the Rust program's store: q in [-127, 127], scale = f16 per row.
    qs = [torch.randint(-127, 128, (a.out, a.inp), generator=g, device=dev, dtype=torch.int8)
          for _ in range(a.matrices)]
    scales = [(1e-3 * (1 + torch.rand(a.out, generator=g, device=dev))).half()
              for _ in range(a.matrices)]
    sync()

    results, skipped, checks = [], [], {}

    def measure(arm, t, launch):
        """Times passes of `launch` (queues one pass, returns its outputs) + one sync; then, as
        many passes again between two CUDA events: the device's own time per pass."""
        def one_pass():
            ys = launch()
            sync()
            del ys

        for _ in range(a.warmup):
            one_pass()
        times = []
        for _ in range(a.passes):
            start = time.perf_counter()
            one_pass()
            times.append(time.perf_counter() - start)
        r = summarize(arm, t, a.matrices, a.matrices * arm_bytes(arm, a.out, a.inp), times)
        device = []
        for _ in range(a.passes):
            begin = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            begin.record()
            ys = launch()
            end.record()
            sync()
            device.append(begin.elapsed_time(end))
            del ys
        r["device_ms"] = median(device)
        print(f"{arm:>8} T={t:<2} x{a.matrices:<2} {r['median_ms']:>9.3f} ms  "
              f"{r['gbps_median']:>8.2f} GB/s (best {r['gbps_best']:.2f}, "
              f"worst {r['gbps_worst']:.2f}), device {r['device_ms']:.3f} ms",
              file=sys.stderr, flush=True)
        results.append(r)

    def check(arm, got, x, k=0):
        """Max |got - ref| / max |ref| against fp32 on the dequantized matrix `k`."""
        w = qs[k].float() * scales[k].float()[:, None]
        ref = x.float() @ w.t()
        err = ((got.float() - ref).abs().max() / ref.abs().max()).item()
        checks[f"{arm}_T{x.shape[0]}"] = err
        if not err < 1e-2:
            raise RuntimeError(f"{arm}: relative error {err:.3e} against the fp32 reference")

    def run_arm(arm, body):
        try:
            body()
        except Exception as e:  # an arm's failure is reported, the others still run
            msg = f"{arm}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            print(f"gemv_torch: arm failed: {msg}", file=sys.stderr, flush=True)
            skipped.append(msg)

    # The two reads: the same bytes summed as int32 words and as float32 values.
    for arm, view in (("read", torch.int32), ("readf32", torch.float32)):
        if arm not in a.arms:
            continue
        views = [q.view(view) for q in qs]

        def read(arm=arm, views=views):
            measure(arm, 0, lambda: [v.sum() for v in views])

        run_arm(arm, read)

    if "fp16" in a.arms:
        def fp16():
            ws = [(q.half() * s[:, None]) for q, s in zip(qs, scales)]
            sync()
            for t in a.t_sweep:
                x = nonzero((t, a.inp), torch.float16)
                check("fp16", F.linear(x, ws[0]), x)

                measure("fp16", t, lambda: [F.linear(x, w) for w in ws])
            del ws
            torch.cuda.empty_cache()

        run_arm("fp16", fp16)

    if "int8pack" in a.arms:
        def int8pack():
            for t in a.t_sweep:
                x = nonzero((t, a.inp), torch.float16)
                check("int8pack", torch._weight_int8pack_mm(x, qs[0], scales[0]), x)

                measure("int8pack", t,
                        lambda: [torch._weight_int8pack_mm(x, q, s) for q, s in zip(qs, scales)])

        run_arm("int8pack", int8pack)

    report = {
        "protocol": "one pass = one product per matrix + one torch.cuda.synchronize(); "
                    "warm-up passes discarded; median and min/max over timed passes (wall "
                    "clock); GB/s counts weight bytes once",
        "device": torch.cuda.get_device_name(dev),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "out": a.out,
        "inp": a.inp,
        "matrices": a.matrices,
        "matrix_mb": a.out * a.inp / 1e6,
        "max_rel_err_vs_fp32": checks,
        "skipped": skipped,
        "arms": results,
    }
    print(table(results))
    print(f"device {report['device']}, torch {report['torch']} (CUDA {report['cuda']}), "
          f"rel err vs fp32 {checks}, skipped {skipped}")
    text = json.dumps(report, indent=2)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text)
    else:
        print(text)
    return 3 if skipped else 0


if __name__ == "__main__":
    sys.exit(main())
