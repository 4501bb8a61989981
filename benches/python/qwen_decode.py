#!/usr/bin/env python3
r"""Qwen2.5-Coder-0.5B greedy decode side by side: `burn-mapped generate` on each store dtype of
--dtypes, and llama.cpp (llama-cpp-python, same GGUF) when `llama.cpp` is among them. One process
per run; the arms alternate within each round (their order rotating by round). Per round and arm:
  - startup (--startup cold,warm; prompt 0, streamed): process spawn to the first token on the
    child's stdout, in-process model-ready / first token, RssAnon (/proc/<pid>/status) at the
    first token. A cold run first drops the arm's files (store directory plus the GGUF, whose
    vocabulary `generate` maps; the GGUF for llama.cpp) with posix_fadvise(DONTNEED), recording
    the resident fraction (mincore) before and after and any other process mapping them (their
    pages stay cached: run it on a quiet machine);
  - decode (`generate --json`) per --tokens count on the float64 reference's four prompts
    (`models/tests/fixtures/qwen25_real/reference.json`): tok/s over the tokens actually timed
    (both stop at the end-of-turn tokens, unless --ignore-eos makes every run generate all of
    them), RssAnon at the end (llama.cpp: also after its load),
    peak RSS (wait4's ru_maxrss); the first 32 tokens against the reference, the first count's
    against the f32 store;
  - in the first --concurrent-rounds rounds, --concurrent processes at once: the largest total
    Pss (Pss_Anon, Pss_File) of their smaps_rollup while all decode, and its ratio to the arm's
    weight files (store directory; GGUF). They share the cores: not a speed figure.
Prints one JSON object (also to --json: raw records, per-arm median/min/max, ratios to
llama.cpp) and a table. An untimed one-token run per arm first converts a missing store.

  python3 benches/python/qwen_decode.py --bin target/release/burn-mapped --device cpu \
      --placement map --dtypes blocks,q8,f32,llama.cpp --tokens 64,256 --threads 2 --json cpu.json
"""

import argparse
import ctypes
import json
import mmap
import os
import re
import selectors
import statistics
import subprocess
import sys
import tempfile
import time

REFERENCE = os.path.join(
    os.path.dirname(os.path.abspath(__file__)),
    "..", "..", "models", "tests", "fixtures", "qwen25_real", "reference.json",
)
LLAMA = "llama.cpp"
# How many of the reference's tokens are compared (it holds more).
REFERENCE_TOKENS = 32

# One process per run. Prints a line at its first token (the parent times it), then one JSON
# object with the fields of `generate --json` that this script reads.
LLAMA_CPP = r"""
import json, sys, time
import numpy as np
from llama_cpp import Llama
def rss_anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
t0 = time.perf_counter()
gguf, ids, n, threads = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
ignore_eos = sys.argv[5] == "1"
llm = Llama(model_path=gguf, n_ctx=len(ids) + n + 8, n_threads=threads,
            n_threads_batch=threads, n_batch=512, verbose=False)
t1 = time.perf_counter()
after_load = rss_anon()
stop = set()
if not ignore_eos:  # the ids `generate` stops at: EOS, <|im_end|>, <|endoftext|>
    stop.add(llm.token_eos())
    for name in (b"<|im_end|>", b"<|endoftext|>"):
        t = llm.tokenize(name, add_bos=False, special=True)
        if len(t) == 1:
            stop.add(t[0])
vocab = llm.n_vocab()
def top():
    return int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,))))
llm.eval(ids)
out = [top()]
t2 = time.perf_counter()
print("first", flush=True)
while len(out) < n and out[-1] not in stop:
    llm.eval([out[-1]])
    out.append(top())
t3 = time.perf_counter()
print(json.dumps({"prompt_ids": ids, "generated_ids": out, "model_ready_ms": (t1 - t0) * 1e3,
                  "time_to_first_token_ms": (t2 - t0) * 1e3, "decode_tokens": len(out) - 1,
                  "decode_tokens_per_s": (len(out) - 1) / (t3 - t2) if t3 > t2 else 0.0,
                  "rss_anon_bytes": rss_anon(), "rss_anon_after_load_bytes": after_load}))
"""

# The line `generate` prints on stderr when it streams (without --json).
STREAM_SUMMARY = re.compile(
    r"model-ready (\d+) ms \| first token (\d+) ms \| decode ([\d.]+) tok/s over (\d+) tokens"
    r" \| RssAnon (\d+) MiB \| RssFile (\d+) MiB")


# --- page cache -----------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes(path):
    """Bytes of `path` in the page cache (mincore over a fresh read-only mapping)."""
    size = os.path.getsize(path)
    if size == 0:
        return 0
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            raise OSError(ctypes.get_errno(), f"mmap {path}")
        try:
            pages = (size + PAGE - 1) // PAGE
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore {path}")
            resident = pages - bytes(vec).count(0)
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)
    return min(resident * PAGE, size)


def residency(groups):
    """{group: resident fraction} over each group's files, and "all"."""
    out, total, res = {}, 0, 0
    for name, files in groups.items():
        t = sum(os.path.getsize(f) for f in files)
        r = sum(resident_bytes(f) for f in files)
        out[name] = r / t if t else None
        total, res = total + t, res + r
    out["all"] = res / total if total else None
    return out


def drop(files):
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def mappers(files):
    """Other processes mapping any of `files` (the kernel keeps mapped pages on a drop)."""
    want = {os.path.realpath(f) for f in files}
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/maps") as maps:
                hit = any(len(p) == 6 and p[5].rstrip("\n") in want
                          for p in (line.split(None, 5) for line in maps))
            if hit:
                with open(f"/proc/{pid}/comm") as comm:
                    found.append({"pid": int(pid), "comm": comm.read().strip()})
        except OSError:
            continue
    return found


# --- children -------------------------------------------------------------------------------

def proc_fields(pid, name, fields):
    """kB fields of /proc/<pid>/<name>, in bytes; None once the process is gone."""
    try:
        with open(f"/proc/{pid}/{name}") as f:
            got = {}
            for line in f:
                key, _, rest = line.partition(":")
                if key in fields:
                    got[key] = int(rest.split()[0]) * 1024
            return got or None
    except (OSError, ValueError, IndexError):
        return None


class Child:
    """A run: spawn time, first stdout byte, exit (wait4: status and peak RSS)."""

    def __init__(self, cmd):
        self.cmd = cmd
        self.err = tempfile.TemporaryFile()
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.err)
        self.fd = self.proc.stdout.fileno()
        os.set_blocking(self.fd, False)
        self.out = bytearray()
        self.first = None
        self.at_first = None
        self.eof = False

    def read(self):
        try:
            data = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return
        if not data:
            self.eof = True
            return
        if self.first is None:
            self.first = time.perf_counter()
            self.at_first = proc_fields(self.proc.pid, "status", {"RssAnon", "RssFile"})
        self.out += data

    def finish(self):
        _, status, usage = os.wait4(self.proc.pid, 0)
        self.wall = time.perf_counter() - self.t0
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        self.proc.stdout.close()
        self.err.seek(0)
        self.stderr = self.err.read().decode(errors="replace")
        self.err.close()
        self.peak_rss = usage.ru_maxrss * 1024
        if self.proc.returncode != 0:
            sys.stderr.write(self.stderr)
            raise SystemExit(f"{' '.join(self.cmd)} failed with {self.proc.returncode}")

    def record(self):
        return {
            "spawn_to_first_output_ms": (self.first - self.t0) * 1e3 if self.first else None,
            "wall_ms": self.wall * 1e3,
            "peak_rss_bytes": self.peak_rss,
            "rss_anon_at_first_output_bytes": (self.at_first or {}).get("RssAnon"),
        }


def run_children(cmds, sample_s=None):
    """Runs `cmds` at once; with `sample_s`, samples smaps_rollup of each every `sample_s`
    seconds while all of them have printed their first token and none has finished."""
    children = [Child(c) for c in cmds]
    sel = selectors.DefaultSelector()
    for c in children:
        sel.register(c.fd, selectors.EVENT_READ, c)
    samples, last = [], 0.0
    while sel.get_map():
        for key, _ in sel.select(sample_s or 1.0):
            key.data.read()
            if key.data.eof:
                sel.unregister(key.fd)
        now = time.perf_counter()
        if (sample_s and now - last >= sample_s and all(c.first for c in children)
                and not any(c.eof for c in children)):
            last = now
            got = [proc_fields(c.proc.pid, "smaps_rollup",
                               {"Rss", "Pss", "Pss_Anon", "Pss_File", "Pss_Shmem"})
                   for c in children]
            if all(got):
                samples.append(got)
    sel.close()
    for c in children:
        c.finish()
    return children, samples


def last_json(child):
    return json.loads(child.out.decode().strip().splitlines()[-1])


def command(args, dtype, prompt, tokens, stream=False):
    if dtype == LLAMA:
        return [sys.executable, "-c", LLAMA_CPP, args.gguf, json.dumps(prompt["prompt_ids"]),
                str(tokens), str(args.threads), "1" if args.ignore_eos else "0"]
    cmd = [args.bin, "generate", "--device", args.device, "--placement", args.placement,
           "--dtype", dtype, "--max-tokens", str(tokens)]
    if args.ignore_eos:
        cmd.append("--ignore-eos")
    if not stream:
        cmd.append("--json")
    if args.cache_dir:
        cmd += ["--cache-dir", args.cache_dir]
    if prompt["is_chat"]:
        cmd += ["--chat", "--prompt", prompt["user_message"]]
    else:
        cmd += ["--prompt", prompt["text"]]
    return cmd


def generate(args, dtype, prompt, tokens):
    """A decode run: `generate --json`'s object (or the llama.cpp script's) plus the parent's
    figures (wall time, peak RSS)."""
    (child,), _ = run_children([command(args, dtype, prompt, tokens)])
    got = last_json(child)
    got["parent"] = child.record()
    return got


def startup(args, dtype, prompt, groups, cold):
    """A streamed run timed from spawn to the first token; `cold` drops `groups`' files first."""
    files = [f for fs in groups.values() for f in fs]
    rec = {"kind": "cold" if cold else "warm"}
    if cold:
        rec["resident_before_drop"] = residency(groups)
        drop(files)
        rec["other_mappers"] = mappers(files)
        if rec["other_mappers"]:
            print(f"warning: {rec['other_mappers']} map {dtype}'s files: their pages stay "
                  "cached", file=sys.stderr)
        rec["resident_after_drop"] = residency(groups)
    (child,), _ = run_children([command(args, dtype, prompt, args.startup_tokens, stream=True)])
    rec.update(child.record())
    if cold:
        rec["resident_after_run"] = residency(groups)
    if dtype == LLAMA:
        got = last_json(child)
        rec.update({k: got[k] for k in ("model_ready_ms", "time_to_first_token_ms",
                                        "decode_tokens", "rss_anon_after_load_bytes")})
    else:
        m = STREAM_SUMMARY.search(child.stderr)
        if not m:
            raise SystemExit(f"no summary line in generate's stderr:\n{child.stderr}")
        rec.update({"model_ready_ms": float(m[1]), "time_to_first_token_ms": float(m[2]),
                    "decode_tokens": int(m[4])})
    return rec


def concurrent(args, dtype, prompt, weight_bytes):
    cmds = [command(args, dtype, prompt, args.concurrent_tokens, stream=True)
            for _ in range(args.concurrent)]
    children, samples = run_children(cmds, sample_s=args.sample_ms / 1e3)
    rec = {"processes": args.concurrent, "tokens": args.concurrent_tokens,
           "samples": len(samples), "weight_bytes": weight_bytes,
           "peak_rss_bytes": [c.peak_rss for c in children]}
    if samples:
        best = max(samples, key=lambda s: sum(p["Pss"] for p in s))
        for key in ("Pss", "Pss_Anon", "Pss_File", "Pss_Shmem", "Rss"):
            if all(key in p for p in best):
                rec[f"total_{key.lower()}_bytes"] = sum(p[key] for p in best)
        rec["per_process_pss_bytes"] = [p["Pss"] for p in best]
        rec["total_pss_over_weight_bytes"] = rec["total_pss_bytes"] / weight_bytes
    return rec


# --- summary --------------------------------------------------------------------------------

def spread(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def arm_summary(runs, starts, conc, tokens_list):
    mine = [r for r in runs if r["tokens"] == tokens_list[0]]
    s = {
        # the first --tokens count, as before
        "decode_tokens_per_s": spread([r["decode_tokens_per_s"] for r in mine]),
        "time_to_first_token_ms": spread([r["time_to_first_token_ms"] for r in mine]),
        "model_ready_ms": spread([r["model_ready_ms"] for r in mine]),
        "decode_tokens_per_s_at": {}, "decode_tokens_timed_at": {},
        "rss_anon_bytes": spread([r["rss_anon_bytes"] for r in mine]),
        "rss_anon_after_load_bytes": spread([r.get("rss_anon_after_load_bytes") for r in mine]),
        "peak_rss_bytes": spread([r["peak_rss_bytes"] for r in mine]),
    }
    for n in tokens_list:
        at = [r for r in runs if r["tokens"] == n]
        s["decode_tokens_per_s_at"][str(n)] = spread([r["decode_tokens_per_s"] for r in at])
        s["decode_tokens_timed_at"][str(n)] = spread([r["decode_tokens"] for r in at])
    for kind in ("warm", "cold"):
        st = [r for r in starts if r["kind"] == kind]
        if not st:
            continue
        s[f"startup_{kind}"] = {
            "spawn_to_first_token_ms": spread([r["spawn_to_first_output_ms"] for r in st]),
            "in_process_time_to_first_token_ms": spread([r["time_to_first_token_ms"] for r in st]),
            "model_ready_ms": spread([r["model_ready_ms"] for r in st]),
            "rss_anon_at_first_token_bytes": spread(
                [r["rss_anon_at_first_output_bytes"] for r in st]),
            "peak_rss_bytes": spread([r["peak_rss_bytes"] for r in st]),
        }
        if kind == "cold":
            s["startup_cold"]["resident_after_drop"] = spread(
                [r["resident_after_drop"]["all"] for r in st])
    if conc:
        s["concurrent"] = {
            "processes": conc[0]["processes"], "weight_bytes": conc[0]["weight_bytes"],
            "total_pss_bytes": spread([c.get("total_pss_bytes") for c in conc]),
            "total_pss_anon_bytes": spread([c.get("total_pss_anon_bytes") for c in conc]),
            "total_pss_file_bytes": spread([c.get("total_pss_file_bytes") for c in conc]),
            "total_pss_over_weight_bytes": spread(
                [c.get("total_pss_over_weight_bytes") for c in conc]),
        }
    return s


def medians(s, prefix=""):
    """Flattens a summary's spreads to {metric path: median}."""
    out = {}
    for k, v in s.items():
        if isinstance(v, dict) and "median" in v:
            out[prefix + k] = v["median"]
        elif isinstance(v, dict):
            out.update(medians(v, f"{prefix}{k}."))
    return out


def ratios(summary):
    if LLAMA not in summary:
        return {}
    ref = medians(summary[LLAMA])
    out = {}
    for arm, s in summary.items():
        if arm == LLAMA:
            continue
        out[arm] = {k: v / ref[k] for k, v in medians(s).items()
                    if k in ref and ref[k] and "resident" not in k}
    return out


def table(result, prompts):
    summary, ratio = result["summary"], result["ratios_to_llama_cpp"]
    mib = 1 << 20
    cols = [(f"tok/s@{n}", f"decode_tokens_per_s_at.{n}", 1, "{:.2f}")
            for n in result["tokens_list"]] + [
        ("warm 1st ms", "startup_warm.spawn_to_first_token_ms", 1, "{:.0f}"),
        ("cold 1st ms", "startup_cold.spawn_to_first_token_ms", 1, "{:.0f}"),
        ("cold resid.", "startup_cold.resident_after_drop", 1, "{:.3f}"),
        ("RssAnon MiB", "rss_anon_bytes", mib, "{:.1f}"),
        ("peak RSS MiB", "peak_rss_bytes", mib, "{:.0f}"),
        (f"Pss MiB x{result['concurrent']}", "concurrent.total_pss_bytes", mib, "{:.0f}"),
        ("Pss/weights", "concurrent.total_pss_over_weight_bytes", 1, "{:.3f}"),
    ]
    print(f"\n{'arm':14}" + "".join(f"{c[0]:>13}" for c in cols))
    for arm, s in summary.items():
        m = medians(s)
        print(f"{arm:14}" + "".join(
            f"{fmt.format(m[key] / scale) if m.get(key) is not None else '-':>13}"
            for _, key, scale, fmt in cols))
    for arm, r in ratio.items():
        print(f"{arm + ' / llama':14}" + "".join(
            f"{f'{r[key]:.2f}x' if key in r and 'resid' not in key else '-':>13}"
            for _, key, _, _ in cols))
    print("(medians; warm/cold 1st: process spawn to first token; RssAnon: end of generation; "
          "Pss: all processes at once, max over samples)")
    print(f"\nref {len(prompts[0]['generated_ids'])}: equal (prefix) per prompt; "
          f"equal to f32 of {result['tokens']}; tokens timed per run (median)")
    for arm, s in summary.items():
        m = medians(s)
        refs = " ".join(f"{r['reference_equal_of_32']}({r['reference_prefix_equal']})"
                        for r in s["per_prompt"])
        f32 = " ".join(str(r.get("f32_equal", "-")) for r in s["per_prompt"])
        timed = " ".join(f"{n}:{m.get(f'decode_tokens_timed_at.{n}', 0):.0f}"
                         for n in result["tokens_list"])
        print(f"{arm:14}{refs}; {f32}; {timed}")


def main():
    class Fmt(argparse.RawDescriptionHelpFormatter):
        def _get_help_string(self, action):
            h = action.help or ""
            if action.default not in (None, False, argparse.SUPPRESS) and "default" not in h:
                h += " (default: %(default)s)"
            return h

    p = argparse.ArgumentParser(description=__doc__, formatter_class=Fmt)
    p.add_argument("--bin", required=True, help="the burn-mapped CLI")
    p.add_argument("--device", default="cpu", help="generate --device")
    p.add_argument("--placement", default="resident", help="generate --placement")
    p.add_argument("--dtypes", default="q8,f32", help="store dtypes, and llama.cpp")
    p.add_argument("--tokens", default="64",
                   help="comma-separated token counts per decode run; the first is the primary "
                        "one (summary's decode_tokens_per_s, reference and f32 comparisons)")
    p.add_argument("--rounds", type=int, default=2, help="rounds of every arm")
    p.add_argument("--long-prompts", type=int, default=4,
                   help="prompts (of the 4) the token counts after the first run on")
    p.add_argument("--long-rounds", type=int,
                   help="rounds the token counts after the first run in (default: all)")
    p.add_argument("--startup", default="cold,warm",
                   help="startup runs per round and arm, comma-separated ('' for none)")
    p.add_argument("--startup-tokens", type=int, default=8, help="tokens of a startup run")
    p.add_argument("--concurrent", type=int, default=4, help="processes at once; 0: none")
    p.add_argument("--concurrent-tokens", type=int, default=128,
                   help="tokens of each concurrent process (prompt 0)")
    p.add_argument("--concurrent-rounds", type=int, default=1,
                   help="rounds (the first ones) with the concurrent runs")
    p.add_argument("--sample-ms", type=float, default=100, help="smaps_rollup sampling period")
    p.add_argument("--cache-dir", help="generate --cache-dir (default: its own)")
    p.add_argument("--gguf", help="the GGUF llama.cpp reads and `generate` takes its vocabulary "
                                  "from (default: qwen2.5-coder-0.5b-instruct-q4_k_m.gguf in "
                                  "the cache directory)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="llama.cpp threads")
    p.add_argument("--ignore-eos", action="store_true",
                   help="every arm generates all --tokens, past end-of-turn tokens")
    p.add_argument("--json", help="also write the JSON object here")
    args = p.parse_args()
    cache = args.cache_dir or os.path.expanduser("~/.cache/burn-mapped")
    args.gguf = args.gguf or os.path.join(cache, "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    tokens_list = [int(t) for t in args.tokens.split(",")]
    long_rounds = args.rounds if args.long_rounds is None else args.long_rounds
    kinds = [k for k in args.startup.split(",") if k]
    if set(kinds) - {"cold", "warm"}:
        raise SystemExit("--startup takes cold, warm")

    reference = json.load(open(REFERENCE))
    prompts = reference["prompts"]
    dtypes = args.dtypes.split(",")
    groups = {}  # arm -> {group: files}: what a cold run drops
    for dtype in dtypes:
        got = generate(args, dtype, prompts[0], 1)
        if dtype == LLAMA:
            groups[dtype] = {"gguf": [args.gguf]}
        else:
            store = got["store"]
            groups[dtype] = {"store": sorted(os.path.join(store, f) for f in os.listdir(store)
                                             if os.path.isfile(os.path.join(store, f))),
                             "gguf": [args.gguf]}
    weight_bytes = {d: sum(os.path.getsize(f) for f in g["store" if d != LLAMA else "gguf"])
                    for d, g in groups.items()}

    runs, starts, concs = [], [], []
    t_begin = time.perf_counter()
    for rnd in range(args.rounds):
        order = dtypes[rnd % len(dtypes):] + dtypes[:rnd % len(dtypes)]
        for dtype in order:
            for kind in sorted(kinds):  # cold, then warm (the pages it needs now cached)
                rec = startup(args, dtype, prompts[0], groups[dtype], kind == "cold")
                rec.update({"round": rnd, "dtype": dtype})
                starts.append(rec)
                print(f"[round {rnd}] {dtype} {kind}: first token "
                      f"{rec['spawn_to_first_output_ms']:.0f} ms from spawn", file=sys.stderr)
        for n in tokens_list:
            if n != tokens_list[0] and rnd >= long_rounds:
                continue
            chosen = prompts if n == tokens_list[0] else prompts[:args.long_prompts]
            for i, prompt in enumerate(chosen):
                for dtype in order:
                    got = generate(args, dtype, prompt, n)
                    if got["prompt_ids"] != prompt["prompt_ids"]:
                        raise SystemExit(f"prompt {i}: ids differ from the reference's")
                    ref = prompt["generated_ids"][:REFERENCE_TOKENS]
                    ids = got["generated_ids"]
                    same_ref = next((k for k, (a, b) in enumerate(zip(ids, ref)) if a != b),
                                    min(len(ids), len(ref)))
                    runs.append({
                        "round": rnd, "dtype": dtype, "prompt": i, "tokens": n,
                        "decode_tokens": got.get("decode_tokens", len(ids) - 1),
                        "decode_tokens_per_s": got["decode_tokens_per_s"],
                        "time_to_first_token_ms": got["time_to_first_token_ms"],
                        "model_ready_ms": got["model_ready_ms"],
                        "rss_anon_bytes": got["rss_anon_bytes"],
                        "rss_anon_after_load_bytes": got.get("rss_anon_after_load_bytes"),
                        "wall_ms": got["parent"]["wall_ms"],
                        "peak_rss_bytes": got["parent"]["peak_rss_bytes"],
                        "generated_ids": ids,
                        "reference_prefix_equal": same_ref,
                        "reference_equal": sum(a == b for a, b in zip(ids, ref)),
                    })
                    print(f"[round {rnd}] {dtype} prompt {i} {n} tokens: "
                          f"{got['decode_tokens_per_s']:.2f} tok/s over "
                          f"{runs[-1]['decode_tokens']}", file=sys.stderr)
        if args.concurrent and rnd < args.concurrent_rounds:
            for dtype in order:
                rec = concurrent(args, dtype, prompts[0], weight_bytes[dtype])
                rec.update({"round": rnd, "dtype": dtype})
                concs.append(rec)
                print(f"[round {rnd}] {dtype} x{args.concurrent}: {rec['samples']} samples, "
                      f"total Pss {rec.get('total_pss_bytes', 0) / 2**20:.0f} MiB",
                      file=sys.stderr)

    summary = {}
    f32 = {(r["round"], r["prompt"]): r["generated_ids"] for r in runs
           if r["dtype"] == "f32" and r["tokens"] == tokens_list[0]}
    for dtype in dtypes:
        mine = [r for r in runs if r["dtype"] == dtype]
        primary = [r for r in mine if r["tokens"] == tokens_list[0]]
        per_prompt = []
        for i in range(len(prompts)):
            first = next(r for r in primary if r["prompt"] == i)
            row = {
                "prompt": i,
                "reference_equal_of_32": first["reference_equal"],
                "reference_prefix_equal": first["reference_prefix_equal"],
                "same_every_round": all(
                    r["generated_ids"] == first["generated_ids"] for r in primary
                    if r["prompt"] == i
                ),
            }
            if dtype != "f32" and (first["round"], i) in f32:
                other = f32[(first["round"], i)]
                row["f32_equal"] = sum(a == b for a, b in zip(first["generated_ids"], other))
                row["of"] = len(other)
            per_prompt.append(row)
        summary[dtype] = arm_summary(
            mine, [r for r in starts if r["dtype"] == dtype],
            [c for c in concs if c["dtype"] == dtype], tokens_list)
        summary[dtype]["per_prompt"] = per_prompt
    result = {
        "device": args.device, "placement": args.placement, "tokens": tokens_list[0],
        "rounds": args.rounds, "tokens_list": tokens_list, "long_prompts": args.long_prompts,
        "long_rounds": long_rounds, "startup": kinds, "startup_tokens": args.startup_tokens,
        "concurrent": args.concurrent, "concurrent_tokens": args.concurrent_tokens,
        "concurrent_rounds": args.concurrent_rounds, "threads": args.threads,
        "ignore_eos": args.ignore_eos, "gguf": args.gguf,
        "weight_bytes": weight_bytes, "cpu_count": os.cpu_count(),
        "seconds": time.perf_counter() - t_begin,
        "summary": summary, "ratios_to_llama_cpp": ratios(summary),
        "runs": runs, "startup_runs": starts, "concurrent_runs": concs,
    }
    text = json.dumps(result, indent=1)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    print(text)
    table(result, prompts)


if __name__ == "__main__":
    main()
