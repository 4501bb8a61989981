#!/usr/bin/env python3
r"""Single-stream GPU decode side by side: `burn-mapped generate` (greedy, --ignore-eos, one
process per run) on the q8 store through the device step and through tensor ops, and on the f32
store, against llama.cpp's `llama-bench -p 0 -n N` with flash attention off and on, all on the
same GGUF, the arms alternating within each round (their order rotating by round).

Per burn-mapped run: decode tok/s (tokens after the first over the time after it), time to the
first token and model-ready time (in-process), and for the device step its launches per token,
whether the step replays a recorded graph, and the host's time per token spent enqueuing steps.
Per llama-bench run: its tok/s (`avg_ts`). Prints one JSON object (also to --json: raw records, per-arm median/min/max, ratios to
llama.cpp's best arm) and a table.

  python3 benches/python/gpu_decode.py --bin ./burn-mapped --llama-bench ./llama-bench \
      --gguf speed.gguf --tokens 128 --rounds 3 --json gpu-decode.json
"""

import argparse
import json
import statistics
import subprocess
import sys
import time

PROMPT = "Write a Python function that checks whether a number is prime."


def run_burn(args, dtype, device_step):
    cmd = [
        args.bin, "generate", "--model", args.gguf, "--device", args.device,
        "--placement", "resident", "--dtype", dtype, "--max-tokens", str(args.tokens),
        "--ignore-eos", "--json", "--chat", "--prompt", PROMPT,
        "--cache-dir", args.cache_dir,
    ]
    if not device_step:
        cmd.append("--no-device-step")
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}\n{p.stderr[-4000:]}")
    s = json.loads(p.stdout.strip().splitlines()[-1])
    return {
        "tok_s": s["decode_tokens_per_s"],
        "ttft_ms": s["time_to_first_token_ms"],
        "model_ready_ms": s["model_ready_ms"],
        "prompt_tokens": len(s["prompt_ids"]),
        "tokens": len(s["generated_ids"]),
        "decode_path": s.get("decode_path"),
        "launches_per_token": s.get("launches_per_token"),
        "host_us_per_token": s.get("host_us_per_token"),
        "wall_s": wall,
        "generated_ids": s["generated_ids"][:32],
    }


def run_llama(args, fa):
    cmd = [args.llama_bench, "-m", args.gguf, "-ngl", "99", "-p", "0", "-n", str(args.tokens),
           "-fa", str(fa), "-r", "1", "-o", "json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}\n{p.stderr[-4000:]}")
    return json.loads(p.stdout)


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
    p.add_argument("--arms", default="q8-step,q8-ops,f32-ops,llama-fa0,llama-fa1")
    p.add_argument("--cache-dir", default="/tmp/bm-cache")
    p.add_argument("--json")
    args = p.parse_args()
    arms = args.arms.split(",")
    # Untimed: converts the stores and compiles the kernels' pipelines once.
    for arm in arms:
        if arm.startswith("q8") or arm.startswith("f32"):
            dtype = arm.split("-")[0]
            cmd_args = argparse.Namespace(**{**vars(args), "tokens": 2})
            run_burn(cmd_args, dtype, arm.endswith("step"))
    records = {arm: [] for arm in arms}
    for r in range(args.rounds):
        order = arms[r % len(arms):] + arms[:r % len(arms)]
        for arm in order:
            if arm.startswith("llama"):
                fa = int(arm[-1])
                rows = run_llama(args, fa)
                tg = next(x for x in rows if x.get("n_gen", 0) > 0)
                rec = {"tok_s": tg["avg_ts"], "build": tg.get("build_commit"),
                       "flash_attn": tg.get("flash_attn")}
            else:
                dtype = arm.split("-")[0]
                rec = run_burn(args, dtype, arm.endswith("step"))
            records[arm].append(rec)
            print(f"round {r} {arm}: {rec['tok_s']:.1f} tok/s", file=sys.stderr, flush=True)
    summary = {}
    for arm, recs in records.items():
        summary[arm] = {k: stats([x.get(k) for x in recs])
                        for k in ("tok_s", "ttft_ms", "model_ready_ms", "host_us_per_token")}
        summary[arm]["launches_per_token"] = recs[0].get("launches_per_token")
        summary[arm]["decode_path"] = recs[0].get("decode_path")
    llama = [summary[a]["tok_s"]["median"] for a in arms if a.startswith("llama")]
    best = max(llama) if llama else None
    ratios = {a: summary[a]["tok_s"]["median"] / best for a in arms if best}
    same = {}
    if "q8-step" in records and "q8-ops" in records:
        a, b = records["q8-step"][0]["generated_ids"], records["q8-ops"][0]["generated_ids"]
        same["q8_step_vs_ops_equal_prefix"] = next(
            (i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    out = {"tokens": args.tokens, "rounds": args.rounds, "gguf": args.gguf,
           "records": records, "summary": summary, "ratios_to_llama_cpp_best": ratios, **same}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    print(json.dumps(out))
    print(f"\n{'arm':10} {'tok/s median (min-max)':28} {'ratio':>6} {'launches':>9} {'host us/tok':>12}")
    for arm in arms:
        s = summary[arm]
        t = s["tok_s"]
        host = f"{s['host_us_per_token']['median']:.0f}" if s["host_us_per_token"] else ""
        span = f"{t['median']:8.1f} ({t['min']:.1f}-{t['max']:.1f})"
        ratio = ratios.get(arm, float("nan"))
        launches = str(s["launches_per_token"] or "")
        print(f"{arm:10} {span:28} {ratio:6.2f} {launches:>9} {host:>12}")

if __name__ == "__main__":
    main()
