#!/usr/bin/env python3
r"""Single-stream GPU decode side by side: `burn-mapped generate` (greedy, --ignore-eos, one
process per run) on the q8 store through the device step and through tensor ops, and on the f32
store, against llama.cpp's `llama-bench -p 0 -n N` with flash attention off and on, all on the
same GGUF, the arms alternating within each round (their order rotating by round). Arms ending
in `-topp` sample instead (`--temperature 0.8 --top-p 0.9 --seed 1`): `q8-step-topp` is the
device step's top-p, `q8-ops-topp` the host sampler's after tensor ops. The `q8-step-batch32`
arm runs the device step with `CUBECL_WGPU_MAX_TASKS=32`, CubeCL's default batch of launches per
submission, where `generate` otherwise submits each step whole (512). Every arm keeps compiled
kernels where `generate` keeps them by default (`<cache-dir>/kernels` on `--device vulkan`),
warm after the first use, except arms ending in `-cold`: each of their processes starts with a
new, empty kernel cache, as the first process on a machine does.

Per burn-mapped run: decode tok/s (tokens after the first over the time after it), time to the
first token and model-ready time (in-process), and for the device step its launches per token,
whether the step replays a recorded graph, the host's time per token spent enqueuing steps, and
the device's time per step (`--device-time`: the steps run again under the device's timer).
Per llama-bench run: its tok/s (`avg_ts`).

First token, per arm and round: a process that loads the model and runs the prompt once.
burn-mapped: `generate --max-tokens 1` (its wall time, and in-process the time from a ready
model to the first token: the prompt's prefill). llama.cpp: `llama-bench -p P -n 0 -r 1
--no-warmup` with P the chat prompt's token count (its wall time, and the prompt's time from its
`avg_ts`). Both processes start cold on a warm page cache. Then the same for a long plain
prompt (the sentence repeated `--long-prompt` times) through the device step and llama.cpp.

Prints one JSON object (also to --json: raw records, per-arm median/min/max, ratios to
llama.cpp's best arm) and a table.

  python3 benches/python/gpu_decode.py --bin ./burn-mapped --llama-bench ./llama-bench \
      --gguf speed.gguf --tokens 128 --rounds 3 --json gpu-decode.json
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

PROMPT = "Write a Python function that checks whether a number is prime."


def burn_arm(arm):
    """`q8-step`, `f32-ops`, `gguf-step`, `q8-step-topp`...: the dtype (`gguf`: the GGUF read in
    place, its blocks on the device, no store), whether the device step runs,
    whether the tokens are sampled (`--temperature 0.8 --top-p 0.9 --seed 1`) or greedy, the
    launch batch, and whether each process starts with an empty kernel cache."""
    parts = arm.split("-")
    return parts[0], "step" in parts, "topp" in parts, "batch32" in parts, "cold" in parts


def run_burn(args, dtype, device_step, top_p=False, batch32=False, cold=False, prompt=None):
    """`prompt` None: the chat prompt; else this text without the chat template. `cold`: a new,
    empty kernel cache for this process."""
    cmd = [
        args.bin, "generate", "--model", args.gguf, "--device", args.device,
        "--placement", "resident", "--max-tokens", str(args.tokens),
        "--ignore-eos", "--json", "--cache-dir", args.cache_dir,
    ]
    if dtype != "gguf":
        cmd += ["--dtype", dtype]
    cmd += ["--chat", "--prompt", PROMPT] if prompt is None else ["--prompt", prompt]
    if device_step:
        cmd.append("--device-time")
    else:
        cmd.append("--no-device-step")
    if top_p:
        cmd += ["--temperature", "0.8", "--top-p", "0.9", "--seed", "1"]
    env = dict(os.environ)
    if batch32:
        env["CUBECL_WGPU_MAX_TASKS"] = "32"
    if cold:
        fresh = tempfile.mkdtemp(prefix="kernels-", dir=args.cache_dir)
        cmd += ["--kernel-cache", fresh]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}\n{p.stderr[-4000:]}")
    s = json.loads(p.stdout.strip().splitlines()[-1])
    return {
        "tok_s": s["decode_tokens_per_s"],
        "ttft_ms": s["time_to_first_token_ms"],
        "model_ready_ms": s["model_ready_ms"],
        "tokenizer_ms": s.get("tokenizer_ms"),
        "device_step_setup_ms": s.get("device_step_setup_ms"),
        "uploaded_bytes": s.get("uploaded_bytes"),
        "prompt_tokens": len(s["prompt_ids"]),
        "tokens": len(s["generated_ids"]),
        "decode_path": s.get("decode_path"),
        "launches_per_token": s.get("launches_per_token"),
        "host_us_per_token": s.get("host_us_per_token"),
        "device_us_per_token": s.get("device_us_per_token"),
        "device_us_by_launch": s.get("device_us_by_launch"),
        "kernel_cache": s.get("kernel_cache"),
        "wall_s": wall,
        "generated_ids": s["generated_ids"][:32],
    }


def run_llama(args, fa, prompt=0, tokens=None, warmup=True):
    cmd = [args.llama_bench, "-m", args.gguf, "-ngl", "99", "-p", str(prompt),
           "-n", str(args.tokens if tokens is None else tokens),
           "-fa", str(fa), "-r", "1", "-o", "json"]
    if not warmup:
        cmd.append("--no-warmup")
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}\n{p.stderr[-4000:]}")
    return json.loads(p.stdout), wall


def first_token(args, arm, prompt_tokens, text=None):
    """One cold process to the first token: wall ms, and the prompt's own ms. `text`: a plain
    prompt instead of the chat prompt (`prompt_tokens` its length)."""
    if arm.startswith("llama"):
        rows, wall = run_llama(args, int(arm[-1]), prompt=prompt_tokens, tokens=0, warmup=False)
        pp = next(x for x in rows if x.get("n_prompt", 0) > 0)
        return {"wall_ms": wall * 1e3, "prompt_ms": prompt_tokens / pp["avg_ts"] * 1e3,
                "prompt_tokens": prompt_tokens}
    one = argparse.Namespace(**{**vars(args), "tokens": 1})
    rec = run_burn(one, *burn_arm(arm), prompt=text)
    # The prompt's ms count the vocabulary's reading and the device step's setup, which the
    # record also gives apart, and, for weights Burn's own upload copied (CubeCL copies them on
    # its own thread after the load), the wait for them. `uploaded_bytes`: what the load copied
    # itself, inside model-ready.
    return {"wall_ms": rec["wall_s"] * 1e3, "prompt_ms": rec["ttft_ms"] - rec["model_ready_ms"],
            "model_ready_ms": rec["model_ready_ms"], "tokenizer_ms": rec["tokenizer_ms"],
            "device_step_setup_ms": rec["device_step_setup_ms"],
            "uploaded_bytes": rec["uploaded_bytes"],
            "prompt_tokens": rec["prompt_tokens"], "kernel_cache": rec["kernel_cache"]}


def cache_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def stats(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", required=True)
    p.add_argument("--llama-bench")
    p.add_argument("--gguf", required=True)
    p.add_argument("--device", default="vulkan")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--arms", default="q8-step,q8-step-topp,q8-step-batch32,q8-ops,f32-ops,"
                   "llama-fa0,llama-fa1")
    p.add_argument("--cache-dir", default="/tmp/bm-cache")
    p.add_argument("--long-prompt", type=int, default=40,
                   help="first token also for the sentence repeated this many times (0: not)")
    p.add_argument("--json")
    p.add_argument("--label", help="what the GGUF is, recorded as given (model, size, weights)")
    p.add_argument("--commit", help="burn-mapped's commit, recorded as given")
    p.add_argument("--gpu", help="the GPU and driver, recorded as given")
    args = p.parse_args()
    arms = args.arms.split(",")
    # First use, one process per dtype on a fresh cache: converts the store, compiles the
    # kernels' pipelines and reaches the first token. Its wall time and the bytes it wrote.
    first_use = {}
    for arm in arms:
        dtype = arm.split("-")[0]
        if dtype in ("q8", "f32", "gguf") and dtype not in first_use:
            before = cache_bytes(args.cache_dir)
            cmd_args = argparse.Namespace(**{**vars(args), "tokens": 2})
            rec = run_burn(cmd_args, *burn_arm(arm))
            first_use[dtype] = {"wall_s": rec["wall_s"],
                                "bytes_written": cache_bytes(args.cache_dir) - before}
            print(f"first use {dtype}: {rec['wall_s']:.1f} s, "
                  f"{first_use[dtype]['bytes_written'] / 1e9:.2f} GB written",
                  file=sys.stderr, flush=True)
    records = {arm: [] for arm in arms}
    firsts = {arm: [] for arm in arms}
    firsts_long = {arm: [] for arm in arms}
    # The chat prompt's length in tokens, for llama.cpp's prompt runs.
    first_burn = next((a for a in arms if not a.startswith("llama")), None)
    prompt_tokens = None
    if first_burn:
        one = argparse.Namespace(**{**vars(args), "tokens": 1})
        prompt_tokens = run_burn(one, *burn_arm(first_burn))[
            "prompt_tokens"]
    # A long plain prompt (the sentence repeated), for the step's prefill against llama.cpp's.
    long_text, long_tokens = None, None
    long_arms = [a for a in ("q8-step", "q8-step-cold", "gguf-step") if a in arms]
    if args.long_prompt and long_arms:
        long_text = " ".join([PROMPT] * args.long_prompt)
        one = argparse.Namespace(**{**vars(args), "tokens": 1})
        long_tokens = run_burn(one, *burn_arm(long_arms[0]), prompt=long_text)["prompt_tokens"]
    for r in range(args.rounds):
        order = arms[r % len(arms):] + arms[:r % len(arms)]
        for arm in order:
            if arm.startswith("llama"):
                fa = int(arm[-1])
                rows, _ = run_llama(args, fa)
                tg = next(x for x in rows if x.get("n_gen", 0) > 0)
                rec = {"tok_s": tg["avg_ts"], "build": tg.get("build_commit"),
                       "flash_attn": tg.get("flash_attn")}
            else:
                rec = run_burn(args, *burn_arm(arm))
            records[arm].append(rec)
            print(f"round {r} {arm}: {rec['tok_s']:.1f} tok/s", file=sys.stderr, flush=True)
        if prompt_tokens:
            for arm in order:
                if arm.endswith("-batch32"):
                    continue
                ft = first_token(args, arm, prompt_tokens)
                firsts[arm].append(ft)
                print(f"round {r} {arm}: first token {ft['wall_ms']:.0f} ms "
                      f"(prompt {ft['prompt_ms']:.1f} ms)", file=sys.stderr, flush=True)
        if long_tokens:
            for arm in order:
                if arm.startswith("llama") or arm in long_arms:
                    ft = first_token(args, arm, long_tokens, text=long_text)
                    firsts_long[arm].append(ft)
                    print(f"round {r} {arm}: first token of {long_tokens} {ft['wall_ms']:.0f} ms "
                          f"(prompt {ft['prompt_ms']:.1f} ms)", file=sys.stderr, flush=True)
    summary = {}
    for arm, recs in records.items():
        summary[arm] = {k: stats([x.get(k) for x in recs])
                        for k in ("tok_s", "ttft_ms", "model_ready_ms", "host_us_per_token",
                                  "device_us_per_token")}
        summary[arm]["first_token"] = {k: stats([x[k] for x in firsts[arm]])
                                       for k in ("wall_ms", "prompt_ms")}
        summary[arm]["first_token_long"] = {k: stats([x[k] for x in firsts_long[arm]])
                                            for k in ("wall_ms", "prompt_ms")}
        kinds = [k for k, _ in recs[0].get("device_us_by_launch") or []]
        summary[arm]["device_us_by_launch"] = {
            k: stats([dict(x.get("device_us_by_launch") or []).get(k) for x in recs])
            for k in kinds}
        summary[arm]["launches_per_token"] = recs[0].get("launches_per_token")
        summary[arm]["decode_path"] = recs[0].get("decode_path")
    llama = [summary[a]["tok_s"]["median"] for a in arms if a.startswith("llama")]
    best = max(llama) if llama else None
    ratios = {a: summary[a]["tok_s"]["median"] / best for a in arms if best}
    same = {}
    for step, ops in (("q8-step", "q8-ops"), ("q8-step-topp", "q8-ops-topp")):
        if step in records and ops in records:
            a, b = records[step][0]["generated_ids"], records[ops][0]["generated_ids"]
            same[f"{step}_vs_{ops}_equal_prefix".replace("-", "_")] = next(
                (i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    build = next((r.get("build") for a in arms if a.startswith("llama")
                  for r in records[a]), None)
    out = {"label": args.label, "commit": args.commit, "gpu": args.gpu, "weights": "random",
           "llama_cpp": {"build_commit": build, "version": "llama-cpp-python 0.3.36 vendor",
                         "flags": "-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90"},
           "first_use": first_use,
           "tokens": args.tokens, "rounds": args.rounds, "gguf": args.gguf,
           "prompt_tokens": prompt_tokens, "long_prompt_tokens": long_tokens,
           "records": records, "first_token": firsts, "first_token_long": firsts_long,
           "summary": summary, "ratios_to_llama_cpp_best": ratios, **same}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    print(json.dumps(out))
    print(f"\n{'arm':14} {'tok/s median (min-max)':28} {'ratio':>6} {'launches':>9} "
          f"{'host us/tok':>12} {'device us/tok':>14}")
    for arm in arms:
        s = summary[arm]
        t = s["tok_s"]
        host = f"{s['host_us_per_token']['median']:.0f}" if s["host_us_per_token"] else ""
        dev = s["device_us_per_token"]
        dev = f"{dev['median']:.0f} ({dev['min']:.0f}-{dev['max']:.0f})" if dev else ""
        span = f"{t['median']:8.1f} ({t['min']:.1f}-{t['max']:.1f})"
        ratio = ratios.get(arm, float("nan"))
        launches = str(s["launches_per_token"] or "")
        print(f"{arm:14} {span:28} {ratio:6.2f} {launches:>9} {host:>12} {dev:>14}")
    for arm in arms:
        kinds = summary[arm]["device_us_by_launch"]
        if not kinds:
            continue
        print(f"\n{arm}: device us per step by kind of launch, each launch timed alone")
        for k, v in kinds.items():
            print(f"  {k:24} {v['median']:8.1f} ({v['min']:.1f}-{v['max']:.1f})")
    for key, n in (("first_token", prompt_tokens), ("first_token_long", long_tokens)):
        if not n:
            continue
        print(f"\nfirst token, {n}-token prompt, one cold process")
        print(f"{'arm':10} {'wall ms median (min-max)':28} {'prompt ms median (min-max)':28}")
        for arm in arms:
            f = summary[arm][key]
            if not f["wall_ms"]:
                continue
            w, q = f["wall_ms"], f["prompt_ms"]
            print(f"{arm:10} {w['median']:8.0f} ({w['min']:.0f}-{w['max']:.0f}){'':10} "
                  f"{q['median']:8.1f} ({q['min']:.1f}-{q['max']:.1f})")

if __name__ == "__main__":
    main()
