#!/usr/bin/env python3
"""The float64 reference's four prompts (models/tests/fixtures/qwen25_real/reference.json)
through `burn-mapped generate --device vulkan --dtype q8` on the real checkpoint, through the
device step and through tensor ops (`--no-device-step`), 32 greedy tokens each: prints one JSON
line per run with how many first tokens equal the reference's. Run from the repository root:

  python3 benches/python/gpu_reference.py ./burn-mapped qwen2.5-coder-0.5b-instruct-q4_k_m.gguf /tmp/cache
"""
import json, subprocess, sys
bin_, gguf, cache = sys.argv[1:4]
d = json.load(open("models/tests/fixtures/qwen25_real/reference.json"))
out = []
for i, p in enumerate(d["prompts"]):
    for step in (True, False):
        cmd = [bin_, "generate", "--model", gguf, "--device", "vulkan", "--placement", "resident",
               "--dtype", "q8", "--max-tokens", "32", "--ignore-eos", "--json", "--cache-dir", cache]
        cmd += ["--chat", "--prompt", p["user_message"]] if p["is_chat"] else ["--prompt", p["text"]]
        if not step:
            cmd.append("--no-device-step")
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            print(r.stderr[-2000:]); continue
        s = json.loads(r.stdout.splitlines()[-1])
        ref, got = p["generated_ids"][:32], s["generated_ids"][:32]
        eq = next((j for j, (a, b) in enumerate(zip(got, ref)) if a != b), min(len(got), len(ref)))
        rec = {"prompt": i, "path": s["decode_path"], "prompt_ids_equal": s["prompt_ids"] == p["prompt_ids"],
               "equal_to_reference": eq, "tok_s": round(s["decode_tokens_per_s"], 1),
               "ttft_ms": round(s["time_to_first_token_ms"]), "generated_ids": got}
        print(json.dumps(rec), flush=True)
