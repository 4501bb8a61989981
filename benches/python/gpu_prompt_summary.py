"""Summary of benches/scripts/gpu_prompt.sh's results (the files in $W/res): per size and build,
each process's wall (spawn to exit, as llama.cpp's are timed), first token after the device is
open and the prompt's own part (first token minus model-ready) on the three
prompts as median (min-max) of the rounds with compiled kernels kept, the same from an empty
kernel cache, the ~1920-token prompt's device time (whole, and by kind of launch), tg128 and
tg1024 (median, min-max of the rounds); llama.cpp's prompt times, process walls, tg128 and tg1024 beside them, and the ratios:
waits as our time over llama.cpp's (below 1 is ahead), rates as ours over llama.cpp's (above 1
is ahead). Prints a table and writes $W/res/summary.json."""
import glob
import json
import os
import statistics

w, builds = os.environ["W"], os.environ.get("BINS", "new").split()
res = f"{w}/res"
PROMPTS = [("chat", 42), ("480", 481), ("1920", 1921)]


def load(name):
    try:
        with open(f"{res}/{name}.json") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def spread(xs):
    xs = [x for x in xs if x is not None]
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)} if xs else None


def wall(name):
    try:
        return float(open(f"{res}/{name}.wall").read())
    except (OSError, ValueError):
        return None


def text(name):
    try:
        return open(f"{res}/{name}").read().strip()
    except OSError:
        return None


llama_build = None
out = {"gpu_and_driver": text("gpu.txt"), "weights": "random blocks (speed-test GGUF)",
       "commits": dict(c.split("=", 1) for c in (text("commits.txt") or "").split() if "=" in c),
       "llama_cpp": "llama-cpp-python 0.3.36 vendored llama.cpp, CUDA, sm_90, flash attention on",
       "sizes": {}}
for size in ["7b", "0.5b"]:
    pp_runs = load(f"llama-pp-{size}") or []
    tg_runs = load(f"llama-tg-{size}") or []
    llama_build = llama_build or next((r.get("build_commit") for r in pp_runs + tg_runs), None)
    llama_pp = {r["n_prompt"]: r for r in pp_runs}
    llama_tg = {r["n_gen"]: r["avg_ts"] for r in tg_runs}
    walls = {}
    for _, p in PROMPTS:
        xs = []
        for f in glob.glob(f"{res}/llama-wall-{size}-{p}-r*.txt"):
            try:
                xs.append(float(open(f).read()))
            except ValueError:
                pass
        walls[p] = spread(xs)
    ll = {"pp_ms": {p: r["avg_ns"] / 1e6 for p, r in llama_pp.items()},
          "pp_tok_s": {p: r["avg_ts"] for p, r in llama_pp.items()},
          "process_wall_ms": walls,
          "tg128_tok_s": llama_tg.get(128), "tg1024_tok_s": llama_tg.get(1024)}
    entry = {"llama": ll, "builds": {}}
    for b in builds:
        e = {}
        for prompt, p in PROMPTS:
            runs = [r for r in (load(f"{b}-{size}-{prompt}-r{r}") for r in range(2)) if r]
            cold = load(f"cold-{b}-{size}-{prompt}")
            wall_ll = walls.get(p)
            ft = spread([r["time_to_first_token_ms"] for r in runs])
            pw = spread([wall(f"{b}-{size}-{prompt}-r{r}") for r in range(2)])
            cold_wall = wall(f"cold-{b}-{size}-{prompt}")
            e[prompt] = {
                "prompt_tokens": len(runs[0]["prompt_ids"]) if runs else None,
                "process_wall_ms": pw,
                "wall_ratio_to_llama_wall": pw["median"] / wall_ll["median"] if pw and wall_ll else None,
                "cold_process_wall_ms": cold_wall,
                "cold_wall_ratio_to_llama_wall": cold_wall / wall_ll["median"] if cold_wall and wall_ll else None,
                "first_token_ms": ft,
                "prompt_part_ms": spread([r["time_to_first_token_ms"] - r["model_ready_ms"] for r in runs]),
                "device_open_ms": spread([r.get("device_open_ms") for r in runs]),
                "model_ready_ms": spread([r["model_ready_ms"] for r in runs]),
                "cold_cache_first_token_ms": cold["time_to_first_token_ms"] if cold else None,
                "ratio_to_llama_wall": ft["median"] / wall_ll["median"] if ft and wall_ll else None,
                "cold_ratio_to_llama_wall": (cold["time_to_first_token_ms"] / wall_ll["median"]
                                             if cold and wall_ll else None),
            }
        prof = load(f"prof-{b}-{size}-1920")
        if prof and prof.get("prompt_device_us"):
            dev = prof["prompt_device_us"] / 1e3
            pp = ll["pp_ms"].get(1921)
            e["prompt_1920_device_ms"] = dev
            e["prompt_1920_tokens"] = len(prof["prompt_ids"])
            e["prompt_throughput_ratio"] = pp / dev if pp else None
        if prof and prof.get("prompt_device_us_by_launch"):
            e["prompt_1920_device_ms_by_launch"] = {k: v / 1e3 for k, v in prof["prompt_device_us_by_launch"]}
        for n in (128, 1024):
            runs = [load(os.path.basename(f)[:-5]) for f in sorted(glob.glob(f"{res}/tg{n}-{b}-{size}-r*.json"))]
            runs = [r for r in runs if r]
            rates = spread([r.get("decode_tokens_per_s") for r in runs])
            rate = rates["median"] if rates else None
            e[f"tg{n}_tok_s"] = rate
            e[f"tg{n}_tok_s_runs"] = rates
            e[f"tg{n}_ratio"] = rate / ll[f"tg{n}_tok_s"] if rate and ll[f"tg{n}_tok_s"] else None
            if runs:
                e["decode_path"] = runs[0].get("decode_path")
        entry["builds"][b] = e
    out["sizes"][size] = entry
out["llama_cpp_build_commit"] = llama_build

with open(f"{res}/summary.json", "w") as f:
    json.dump(out, f, indent=1)


def fmt(x, spec=".0f"):
    return "-" if x is None else format(x, spec)


print(f"{out['gpu_and_driver']}; commits {out['commits']}; llama.cpp build {llama_build}")
for size, entry in out["sizes"].items():
    ll = entry["llama"]
    print(f"== {size}  llama.cpp: pp42/481/1921 "
          + " / ".join(fmt(ll["pp_ms"].get(p), ".1f") for _, p in PROMPTS)
          + " ms; process wall " + " / ".join(
              fmt((ll["process_wall_ms"][p] or {}).get("median")) for _, p in PROMPTS)
          + f" ms; tg128 {fmt(ll['tg128_tok_s'], '.1f')}, tg1024 {fmt(ll['tg1024_tok_s'], '.1f')} tok/s")
    for b, e in entry["builds"].items():
        cells = []
        for prompt, _ in PROMPTS:
            c = e[prompt]
            ft = c["first_token_ms"]
            pw = c["process_wall_ms"]
            cells.append(f"{prompt}: {fmt(pw and pw['median'])} ({fmt(c['wall_ratio_to_llama_wall'], '.2f')}x), "
                         f"cold {fmt(c['cold_process_wall_ms'])} ({fmt(c['cold_wall_ratio_to_llama_wall'], '.2f')}x), "
                         f"first token {fmt(ft and ft['median'])}")
        print(f"  {b} process wall ms: " + "; ".join(cells))
        if "prompt_1920_device_ms" in e:
            print(f"     ~1920-token prompt on the device: {e['prompt_1920_device_ms']:.1f} ms, "
                  f"throughput {fmt(e['prompt_throughput_ratio'], '.2f')}x llama.cpp's pp1921")
        if "prompt_1920_device_ms_by_launch" in e:
            print("     by launch (each timed alone): " + ", ".join(
                f"{k} {v:.1f}" for k, v in e["prompt_1920_device_ms_by_launch"].items()))
        span = lambda n: (f" [{e[f'tg{n}_tok_s_runs']['min']:.1f}-{e[f'tg{n}_tok_s_runs']['max']:.1f}]"
                          if e.get(f"tg{n}_tok_s_runs") else "")
        print(f"     tg128 {fmt(e['tg128_tok_s'], '.1f')}{span(128)} ({fmt(e['tg128_ratio'], '.2f')}x), "
              f"tg1024 {fmt(e['tg1024_tok_s'], '.1f')}{span(1024)} ({fmt(e['tg1024_ratio'], '.2f')}x); {e.get('decode_path')}")
