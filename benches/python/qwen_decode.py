#!/usr/bin/env python3
"""Qwen2.5-Coder-0.5B greedy decode through `burn-mapped generate`, per store dtype and device,
and through llama.cpp (llama-cpp-python) on the same GGUF when `llama.cpp` is among --dtypes.

Runs the CLI once per (round, dtype, prompt) on the four prompts of the float64 reference
(`models/tests/fixtures/qwen25_real/reference.json`), each in its own process, and reports:
  - decode tokens/s and time to first token (median, min, max over prompts and rounds);
  - how many of the first 32 generated tokens equal the float64 reference's;
  - how many of the 64 tokens of each dtype equal the f32 store's on the same device.
Prints one JSON object (also to --json) and a short table. The first run of a dtype converts
the GGUF into its store (cached under --cache-dir); an untimed one-token run does that first.

The llama.cpp arm feeds the reference's prompt ids to llama-cpp-python in a process of its own
per run, with --threads threads, greedy, and reports the same fields as `generate --json`
(model-ready: the model's load; time to first token: load + prompt, from the start of loading). Arms alternate within each round, so rates compare as ratios.

  python3 benches/python/qwen_decode.py --bin target/release/burn-mapped --device cpu \
      --placement map --dtypes blocks,q8,llama.cpp --json cpu.json
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

REFERENCE = os.path.join(
    os.path.dirname(os.path.abspath(__file__)),
    "..", "..", "models", "tests", "fixtures", "qwen25_real", "reference.json",
)


LLAMA_CPP = r"""
import json, sys, time
import numpy as np
from llama_cpp import Llama
t0 = time.perf_counter()
gguf, ids, n, threads = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
llm = Llama(model_path=gguf, n_ctx=len(ids) + n + 8, n_threads=threads,
            n_threads_batch=threads, n_batch=512, verbose=False)
t1 = time.perf_counter()
vocab = llm.n_vocab()
def top():
    return int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,))))
llm.eval(ids)
out = [top()]
t2 = time.perf_counter()
while len(out) < n:
    llm.eval([out[-1]])
    out.append(top())
t3 = time.perf_counter()
print(json.dumps({"prompt_ids": ids, "generated_ids": out, "model_ready_ms": (t1 - t0) * 1e3,
                  "time_to_first_token_ms": (t2 - t0) * 1e3,
                  "decode_tokens_per_s": (n - 1) / (t3 - t2), "rss_anon_bytes": None}))
"""


def llama_cpp(args, prompt, tokens):
    cmd = [sys.executable, "-c", LLAMA_CPP, args.gguf, json.dumps(prompt["prompt_ids"]),
           str(tokens), str(args.threads)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        raise SystemExit(f"llama.cpp run failed with {done.returncode}")
    return json.loads(done.stdout)


def generate(args, dtype, prompt, tokens):
    if dtype == "llama.cpp":
        return llama_cpp(args, prompt, tokens)
    cmd = [
        args.bin, "generate", "--json", "--device", args.device, "--placement", args.placement,
        "--dtype", dtype, "--max-tokens", str(tokens),
    ]
    if args.cache_dir:
        cmd += ["--cache-dir", args.cache_dir]
    if prompt["is_chat"]:
        cmd += ["--chat", "--prompt", prompt["user_message"]]
    else:
        cmd += ["--prompt", prompt["text"]]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        raise SystemExit(f"{' '.join(cmd)} failed with {done.returncode}")
    return json.loads(done.stdout)


def spread(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--bin", required=True, help="the burn-mapped CLI")
    p.add_argument("--device", default="cpu")
    p.add_argument("--placement", default="resident")
    p.add_argument("--dtypes", default="q8,f32")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--cache-dir")
    p.add_argument("--gguf", default=os.path.expanduser(
        "~/.cache/burn-mapped/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
        help="the GGUF llama.cpp reads (the checkpoint the stores were converted from)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="llama.cpp threads")
    p.add_argument("--json")
    args = p.parse_args()

    reference = json.load(open(REFERENCE))
    prompts = reference["prompts"]
    dtypes = args.dtypes.split(",")
    runs = []
    for dtype in dtypes:
        generate(args, dtype, prompts[0], 1)
    for rnd in range(args.rounds):
        for dtype in dtypes:
            for i, prompt in enumerate(prompts):
                got = generate(args, dtype, prompt, args.tokens)
                if got["prompt_ids"] != prompt["prompt_ids"]:
                    raise SystemExit(f"prompt {i}: ids differ from the reference's")
                ref = prompt["generated_ids"]
                ids = got["generated_ids"]
                same_ref = next(
                    (k for k, (a, b) in enumerate(zip(ids, ref)) if a != b), min(len(ids), len(ref))
                )
                runs.append({
                    "round": rnd, "dtype": dtype, "prompt": i,
                    "decode_tokens_per_s": got["decode_tokens_per_s"],
                    "time_to_first_token_ms": got["time_to_first_token_ms"],
                    "model_ready_ms": got["model_ready_ms"],
                    "rss_anon_bytes": got["rss_anon_bytes"],
                    "generated_ids": ids,
                    "reference_prefix_equal": same_ref,
                    "reference_equal": sum(a == b for a, b in zip(ids, ref)),
                })

    summary = {}
    f32 = {(r["round"], r["prompt"]): r["generated_ids"] for r in runs if r["dtype"] == "f32"}
    for dtype in dtypes:
        mine = [r for r in runs if r["dtype"] == dtype]
        per_prompt = []
        for i in range(len(prompts)):
            first = next(r for r in mine if r["prompt"] == i)
            row = {
                "prompt": i,
                "reference_equal_of_32": first["reference_equal"],
                "reference_prefix_equal": first["reference_prefix_equal"],
                "same_every_round": all(
                    r["generated_ids"] == first["generated_ids"] for r in mine if r["prompt"] == i
                ),
            }
            if dtype != "f32" and (first["round"], i) in f32:
                other = f32[(first["round"], i)]
                row["f32_equal"] = sum(a == b for a, b in zip(first["generated_ids"], other))
                row["of"] = len(other)
            per_prompt.append(row)
        summary[dtype] = {
            "decode_tokens_per_s": spread([r["decode_tokens_per_s"] for r in mine]),
            "time_to_first_token_ms": spread([r["time_to_first_token_ms"] for r in mine]),
            "model_ready_ms": spread([r["model_ready_ms"] for r in mine]),
            "per_prompt": per_prompt,
        }
    result = {
        "device": args.device, "placement": args.placement, "tokens": args.tokens,
        "rounds": args.rounds, "summary": summary, "runs": runs,
    }
    text = json.dumps(result, indent=1)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    print(text)
    print(f"\n{'dtype':9} {'tok/s median (min-max)':26} {'TTFT ms':10} "
          f"ref {len(prompts[0]['generated_ids'])}: equal (prefix) per prompt; "
          f"equal to f32 of {args.tokens}")
    for dtype, s in summary.items():
        d = s["decode_tokens_per_s"]
        refs = " ".join(f"{r['reference_equal_of_32']}({r['reference_prefix_equal']})"
                        for r in s["per_prompt"])
        f32 = " ".join(str(r.get("f32_equal", "-")) for r in s["per_prompt"])
        print(f"{dtype:9} {d['median']:7.2f} ({d['min']:.2f}-{d['max']:.2f}){'':8} "
              f"{s['time_to_first_token_ms']['median']:8.1f}   {refs}; {f32}")


if __name__ == "__main__":
    main()
