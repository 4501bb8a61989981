"""Summary of benches/scripts/gpu_prompt.sh's results (the files in $W/res): per size and build,
spawn-to-first-token and the prompt's own part (first token minus model-ready) on the three
prompts as median (min-max) of the rounds, the ~1920-token prompt's device time by kind of
launch, the first token from an empty kernel cache, tg128; llama.cpp's prompt times, process
walls and tg128 beside them, and the ratios. Prints a table and writes $W/res/summary.json."""
import glob
import json
import os
import statistics

w, builds = os.environ["W"], os.environ.get("BINS", "new").split()
res = f"{w}/res"


def load(name):
    try:
        with open(f"{res}/{name}.json") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def spread(xs):
    xs = [x for x in xs if x is not None]
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)} if xs else None


out = {"gpu": open(f"{res}/gpu.txt").read().strip(), "weights": "random blocks (speed-test GGUF)",
       "sizes": {}}
for size in ["7b", "0.5b"]:
    llama_pp = {r["n_prompt"]: r for r in (load(f"llama-pp-{size}") or [])}
    llama_tg = load(f"llama-tg-{size}") or []
    walls = {}
    for p in [42, 481, 1921]:
        xs = []
        for f in glob.glob(f"{res}/llama-wall-{size}-{p}-r*.txt"):
            try:
                xs.append(float(open(f).read()))
            except ValueError:
                pass
        walls[p] = spread(xs)
    entry = {"llama": {
        "pp_ms": {p: r["avg_ns"] / 1e6 for p, r in llama_pp.items()},
        "pp_tok_s": {p: r["avg_ts"] for p, r in llama_pp.items()},
        "process_wall_ms": walls,
        "tg128_tok_s": llama_tg[0]["avg_ts"] if llama_tg else None,
    }, "builds": {}}
    for b in builds:
        e = {}
        for prompt in ["chat", "480", "1920"]:
            runs = [load(f"{b}-{size}-{prompt}-r{r}") for r in range(2)]
            runs = [r for r in runs if r]
            e[prompt] = {
                "prompt_tokens": len(runs[0]["prompt_ids"]) if runs else None,
                "first_token_ms": spread([r["time_to_first_token_ms"] for r in runs]),
                "prompt_part_ms": spread([r["time_to_first_token_ms"] - r["model_ready_ms"] for r in runs]),
                "model_ready_ms": spread([r["model_ready_ms"] for r in runs]),
            }
        prof = load(f"prof-{b}-{size}-1920")
        kinds = prof.get("prompt_device_us_by_launch") if prof else None
        if kinds:
            e["prompt_1920_device_ms"] = {k: v / 1e3 for k, v in kinds}
            e["prompt_1920_device_ms_total"] = sum(v for _, v in kinds) / 1e3
        cold = load(f"cold-{b}-{size}")
        e["cold_cache_chat_first_token_ms"] = cold["time_to_first_token_ms"] if cold else None
        e["cold_cache_kernels"] = cold.get("kernel_cache") if cold else None
        tg = load(f"tg-{b}-{size}")
        e["tg128_tok_s"] = tg["decode_tokens_per_s"] if tg else None
        e["decode_path"] = tg.get("decode_path") if tg else None
        entry["builds"][b] = e
    out["sizes"][size] = entry

with open(f"{res}/summary.json", "w") as f:
    json.dump(out, f, indent=1)
for size, entry in out["sizes"].items():
    ll = entry["llama"]
    print(f"== {size}  llama.cpp: pp42/481/1921 "
          + " / ".join(f"{ll['pp_ms'].get(p, float('nan')):.1f}" for p in (42, 481, 1921))
          + " ms; process wall " + " / ".join(
              f"{ll['process_wall_ms'][p]['median']:.0f}" if ll["process_wall_ms"][p] else "-"
              for p in (42, 481, 1921)) + f" ms; tg128 {ll['tg128_tok_s']}")
    for b, e in entry["builds"].items():
        cells = []
        for prompt, p in [("chat", 42), ("480", 481), ("1920", 1921)]:
            ft, part = e[prompt]["first_token_ms"], e[prompt]["prompt_part_ms"]
            wall = ll["process_wall_ms"].get(p)
            ratio = f" {ft['median'] / wall['median']:.2f}x" if ft and wall else ""
            cells.append(f"{prompt}: {ft['median']:.0f}{ratio} (prompt {part['median']:.0f})" if ft else f"{prompt}: -")
        print(f"  {b}: " + "; ".join(cells))
        if "prompt_1920_device_ms_total" in e:
            dev = e["prompt_1920_device_ms_total"]
            pp = ll["pp_ms"].get(1921)
            print(f"     1920-token prompt on the device: {dev:.1f} ms"
                  + (f", {pp / dev:.2f}x llama.cpp's pp1921 ({pp:.1f} ms)" if pp else "")
                  + ": " + ", ".join(f"{k} {v:.1f}" for k, v in e["prompt_1920_device_ms"].items()))
        print(f"     cold kernel cache, chat: {e['cold_cache_chat_first_token_ms']} ms; tg128 {e['tg128_tok_s']}")
