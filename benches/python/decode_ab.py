#!/usr/bin/env python3
"""Decode speed of several burn-mapped builds (and llama.cpp) on one GGUF, arms alternating.

For a kernel change: the build before it and the build after it, each pinned to a CPU tier if
asked, against llama.cpp's own `llama-bench`, in one run on one machine, so that the machine's
drift (a shared VM's memory bandwidth moves by a third from minute to minute) falls on every arm
alike. Standard library only; the machine and summary helpers are qwen_decode.py's.

Arms (--arm, repeatable), `LABEL=SPEC`:
  - `LABEL=bin:PATH[@TIER]`: `PATH generate --model GGUF --prompt P --max-tokens N
    --ignore-eos --placement map --json`, tok/s over the tokens after the first as `generate`
    reports it; `@TIER` sets BURN_MAPPED_CPU (scalar, avx2, avx512vnni);
  - `LABEL=llama:PATH`: `PATH -m GGUF -t THREADS -p 0 -n N -r 1 -o json` (tok/s over all N).
Every process gets --threads threads. Each round runs every arm once, the order rotating by
round. Prints one JSON object (also to --json: machine, what each arm's build was given as,
llama.cpp's `--version`, the GGUF's size and whether its weights are random, raw runs, medians
with min/max, ratios to --baseline and the --pair arms, paired per round) and a table.

  python3 benches/python/decode_ab.py --gguf speed-7b.gguf --random-weights --tokens 32 \
      --arm before=bin:/tmp/bm-before --arm after=bin:target/release/burn-mapped \
      --arm llama.cpp=llama:/tmp/llama-build/bin/llama-bench --baseline llama.cpp \
      --build before=c2378a5 --build after=a10c81b --rounds 5 --json ab.json
(add `--pair A=B` for a ratio between two other arms, such as two builds).
"""

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qwen_decode import ab_arguments, ab_record, emit, rotations, spread  # noqa: E402


def run_arm(spec, args):
    kind, _, rest = spec.partition(":")
    if kind == "bin":
        path, _, tier = rest.partition("@")
        env = dict(os.environ, BURN_MAPPED_THREADS=str(args.threads))
        if tier:
            env["BURN_MAPPED_CPU"] = tier
        cmd = [path, "generate", "--model", args.gguf, "--prompt", args.prompt, "--max-tokens",
               str(args.tokens), "--ignore-eos", "--placement", "map", "--json"]
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
        d = json.loads(out.stdout)
        return d["decode_tokens_per_s"], {"cpu_tier": d.get("cpu_tier"), "decode_path": d.get("decode_path")}
    if kind == "llama":
        cmd = [rest, "-m", args.gguf, "-t", str(args.threads), "-p", "0", "-n", str(args.tokens), "-r", "1", "-o", "json"]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        d = json.loads(out.stdout)[0]
        return d["avg_ts"], {"build_commit": d.get("build_commit"), "cpu_info": d.get("cpu_info")}
    sys.exit(f"arm spec {spec!r}: expected bin:PATH[@TIER] or llama:PATH")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ab_arguments(ap, "LABEL=bin:PATH[@TIER] or LABEL=llama:PATH")
    ap.add_argument("--baseline", help="the arm the others' paired ratios are taken to")
    ap.add_argument("--pair", action="append", default=[], help="A=B: also A's ratio to B, paired per round")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompt", default="def fibonacci(n):")
    args = ap.parse_args()

    arms = [tuple(a.split("=", 1)) for a in args.arm]
    labels = [label for label, _ in arms]
    if args.baseline and args.baseline not in labels:
        sys.exit(f"--baseline {args.baseline} is not an arm")
    pairs = [(label, args.baseline) for label in labels if args.baseline and label != args.baseline]
    for p in args.pair:
        a, _, b = p.partition("=")
        if a not in labels or b not in labels:
            sys.exit(f"--pair {p}: both sides must be arms")
        pairs.append((a, b))
    runs = []
    for r, label, spec in rotations(arms, args.rounds):
        tps, info = run_arm(spec, args)
        runs.append({"round": r, "arm": label, "tok_s": tps, **info})
        print(f"[round {r}] {label}: {tps:.2f} tok/s", file=sys.stderr)

    summary = {label: spread([x["tok_s"] for x in runs if x["arm"] == label]) for label in labels}

    def tok_s(label, r):
        return next(x["tok_s"] for x in runs if x["arm"] == label and x["round"] == r)

    paired = {}
    for a, b in pairs:
        ratios = [tok_s(a, r) / tok_s(b, r) for r in range(args.rounds)]
        paired[f"{a} / {b}"] = {**spread(ratios), "per_round": ratios}
    result = {
        **ab_record(args, arms),
        "prompt": args.prompt,
        "summary": summary,
        "baseline": args.baseline,
        "paired_ratios": paired,
        "runs": runs,
    }
    emit(result, args.json)
    print(f"\n{'arm':<16} {'tok/s median':>12} {'min':>8} {'max':>8}")
    for label in labels:
        s = summary[label]
        print(f"{label:<16} {s['median']:>12.2f} {s['min']:>8.2f} {s['max']:>8.2f}")
    for name, p in paired.items():
        print(f"{name:<34} {p['median']:.2f}x [{p['min']:.2f}, {p['max']:.2f}]")

if __name__ == "__main__":
    main()
