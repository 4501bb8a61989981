#!/usr/bin/env python3
r"""Qwen2.5-Coder-0.5B greedy decode side by side, one process per run, standard library only.

Arms (--dtypes, comma-separated):
  - a store dtype (blocks, q8, f32, f16, bf16): `burn-mapped generate --model GGUF --dtype NAME`,
    the GGUF converted once into the cache's store of that dtype;
  - `gguf`: `burn-mapped generate --model GGUF` without --dtype: on the CPU the GGUF itself is
    read in place (no store; `generate --json` reports "in_place": true);
  - `llama.cpp`: llama.cpp's own C++ tools on the same GGUF (--llama-bench, --llama-completion):
    `llama-bench -p 0 -n N -r 1 -o json` for decode (tg N; -r is --llama-reps), `llama-bench
    -p P -n 0` for prompt processing (pp P, P = the startup prompt's length in tokens, or
    --llama-pp), both once per round, and a cold or warm `llama-completion` process (greedy,
    -no-cnv, --no-display-prompt, --no-warmup) per startup run. llama-bench's tg feeds random tokens, so llama.cpp's decode tokens are not compared
    against the reference; its startup runs' text is compared with the reference's text.
An arm `NAME@TIER` (`gguf@avx2`) runs NAME with its CPU kernels pinned to TIER
(BURN_MAPPED_CPU), so one machine compares its tiers in the same run.
Every process gets the same thread count (--threads: llama.cpp's -t, BURN_MAPPED_THREADS).

The arms alternate within each round, their order rotating by round. Per round and arm:
  - startup (--startup cold,warm; prompt 0, streamed): process spawn to the first byte of
    generated text on the child's stdout, RssAnon (/proc/<pid>/status) at that byte and its
    largest sample, and the prefill time (burn-mapped: in-process first token minus
    model-ready; llama.cpp: pp P from llama-bench). A cold run first drops the arm's files
    (store directory plus the GGUF, whose vocabulary `generate` maps; the GGUF alone for
    `gguf` and llama.cpp) with posix_fadvise(DONTNEED), recording the resident fraction
    (mincore) before and after and any other process mapping them (their pages stay cached:
    run it on a quiet machine);
  - decode per --tokens count: burn-mapped arms `generate --json` on the float64 reference's
    four prompts (`models/tests/fixtures/qwen25_real/reference.json`), tok/s over the tokens
    after the first (both stop at the end-of-turn tokens unless --ignore-eos), RssAnon at the
    end and its largest sample during the run, peak RSS (wait4's ru_maxrss), the first 32
    tokens against the reference and the first count's against the f32 store; llama.cpp one
    `llama-bench` tg N per round (tok/s over N tokens, largest RssAnon sample, peak RSS);
  - in the first --concurrent-rounds rounds, --concurrent processes at once (burn-mapped:
    `generate`; llama.cpp: `llama-completion`), each generating --concurrent-tokens past any
    end of turn so that they overlap: the largest total Pss (Pss_Anon, Pss_File) of their
    smaps_rollup while all decode, and its ratio to the arm's weight files (store directory;
    GGUF). They share the cores: not a speed figure.
Prints one JSON object (also to --json: the machine, the commits, raw records, per-arm
median/min/max, per-round paired ratios to llama.cpp and ratios of medians) and a table. An
untimed one-token run per arm first converts a missing store.

  python3 benches/python/qwen_decode.py --bin target/release/burn-mapped --device cpu \
      --placement map --dtypes gguf,blocks,q8,f32,llama.cpp --tokens 64,256 --threads 2 \
      --ignore-eos --llama-bench /tmp/llama-build/bin/llama-bench \
      --llama-completion /tmp/llama-build/bin/llama-completion \
      --llama-build-flags "-G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON ..." \
      --json cpu.json
"""

import argparse
import ctypes
import json
import mmap
import os
import platform
import re
import selectors
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
REFERENCE = os.path.join(ROOT, "models", "tests", "fixtures", "qwen25_real", "reference.json")
LLAMA = "llama.cpp"
GGUF_ARM = "gguf"  # the GGUF read in place: `generate --model GGUF` without --dtype
# The plain sentence of --startup-prompt sentence:N (and cold_start.py's prompts).
SENTENCE = "Write a Python function that checks whether a number is prime."
# How many of the reference's tokens are compared (it holds more).
REFERENCE_TOKENS = 32
CPU_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512bw", "avx512vl")

# The line `generate` prints on stderr when it streams (without --json).
STREAM_SUMMARY = re.compile(
    r"model-ready (\d+) ms \| first token (\d+) ms \| decode ([\d.]+) tok/s over (\d+) tokens"
    r" \| RssAnon (\d+) MiB \| RssFile (\d+) MiB")
# llama-completion's own timings on stderr (common_perf_print).
LLAMA_PERF = {
    "load_ms": re.compile(r"load time =\s*([\d.]+) ms"),
    "prompt_eval_ms": re.compile(r"prompt eval time =\s*([\d.]+) ms"),
    "eval_ms": re.compile(r"\beval time =\s*([\d.]+) ms /\s*\d+ runs"),
    "eval_runs": re.compile(r"\beval time =\s*[\d.]+ ms /\s*(\d+) runs"),
}


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
    """A run: spawn time, first stdout byte, RssAnon samples, exit (wait4: status, peak RSS)."""

    def __init__(self, cmd, env=None):
        self.cmd = cmd
        self.err = tempfile.TemporaryFile()
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=self.err, env=env)
        self.fd = self.proc.stdout.fileno()
        os.set_blocking(self.fd, False)
        self.out = bytearray()
        self.first = None
        self.at_first = None
        self.eof = False
        self.rss_anon_max = None

    def sample(self):
        got = proc_fields(self.proc.pid, "status", {"RssAnon"})
        if got and "RssAnon" in got:
            self.rss_anon_max = max(self.rss_anon_max or 0, got["RssAnon"])

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
            if self.at_first and "RssAnon" in self.at_first:
                self.rss_anon_max = max(self.rss_anon_max or 0, self.at_first["RssAnon"])
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
            sys.stderr.write(self.stderr[-20000:])
            raise SystemExit(f"{' '.join(self.cmd)} failed with {self.proc.returncode}")

    def record(self):
        return {
            "spawn_to_first_output_ms": (self.first - self.t0) * 1e3 if self.first else None,
            "wall_ms": self.wall * 1e3,
            "peak_rss_bytes": self.peak_rss,
            "rss_anon_at_first_output_bytes": (self.at_first or {}).get("RssAnon"),
            "rss_anon_max_sampled_bytes": self.rss_anon_max,
        }


def run_children(cmds, sample_s, env=None, pss=False):
    """Runs `cmds` at once, sampling each one's RssAnon every `sample_s` seconds; with `pss`,
    also samples smaps_rollup of each while all of them have printed their first output and
    none has finished."""
    children = [Child(c, env) for c in cmds]
    sel = selectors.DefaultSelector()
    for c in children:
        sel.register(c.fd, selectors.EVENT_READ, c)
    samples, last = [], 0.0
    while sel.get_map():
        for key, _ in sel.select(sample_s):
            key.data.read()
            if key.data.eof:
                sel.unregister(key.fd)
        now = time.perf_counter()
        if now - last < sample_s:
            continue
        last = now
        for c in children:
            if not c.eof:
                c.sample()
        if pss and all(c.first for c in children) and not any(c.eof for c in children):
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


def base_arm(arm):
    """`gguf@avx2` -> (`gguf`, `avx2`): the arm's dtype and its pinned CPU tier, if any."""
    dtype, _, tier = arm.partition("@")
    return dtype, tier or None


def burn_env(args, arm):
    env = dict(os.environ)
    env["BURN_MAPPED_THREADS"] = str(args.threads)
    tier = base_arm(arm)[1]
    if tier:
        env["BURN_MAPPED_CPU"] = tier
    return env


def burn_command(args, arm, prompt, tokens, stream=False, ignore_eos=False):
    cmd = [args.bin, "generate", "--model", args.gguf, "--device", args.device,
           "--placement", args.placement, "--max-tokens", str(tokens)]
    if base_arm(arm)[0] != GGUF_ARM:
        cmd += ["--dtype", base_arm(arm)[0]]
    if args.ignore_eos or ignore_eos:
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


def completion_command(args, prompt, tokens, ignore_eos=False):
    """A llama-completion run: greedy, the prompt's text as is (special tokens parsed), only the
    generated text on stdout, no warm-up run, a context just large enough."""
    cmd = [args.llama_completion, "-m", args.gguf, "-p", prompt["text"], "-n", str(tokens),
           "--temp", "0", "-t", str(args.threads), "-no-cnv", "--no-display-prompt",
           "--no-warmup", "-c", str(len(prompt["prompt_ids"]) + tokens + 8)]
    if args.ignore_eos or ignore_eos:
        cmd.append("--ignore-eos")
    return cmd


def llama_bench(args, n_prompt, n_gen):
    """One `llama-bench` test (-r --llama-reps): its JSON record plus the parent's figures."""
    cmd = [args.llama_bench, "-m", args.gguf, "-t", str(args.threads), "-p", str(n_prompt),
           "-n", str(n_gen), "-r", str(args.llama_reps), "-o", "json"]
    (child,), _ = run_children([cmd], args.sample_ms / 1e3)
    recs = json.loads(child.out.decode())
    if len(recs) != 1:
        raise SystemExit(f"{' '.join(cmd)}: expected one test, got {len(recs)}")
    rec = recs[0]
    rec["parent"] = child.record()
    return rec


def generate(args, arm, prompt, tokens):
    """A decode run: `generate --json`'s object plus the parent's figures."""
    (child,), _ = run_children([burn_command(args, arm, prompt, tokens)], args.sample_ms / 1e3,
                               env=burn_env(args, arm))
    got = last_json(child)
    got["parent"] = child.record()
    return got


def text_matches_reference(text, prompt):
    """Whether llama-completion's text (trailing whitespace and any end-of-text marker cut)
    begins the reference's generated text; None when it is longer than the reference's."""
    text = text.replace("[end of text]", "").rstrip()
    ref = prompt["generated_text"]
    if len(text) > len(ref):
        return None
    return ref.startswith(text)


def startup(args, arm, prompt, groups, cold):
    """A streamed run timed from spawn to the first generated byte; `cold` drops `groups`'
    files first."""
    files = [f for fs in groups.values() for f in fs]
    rec = {"kind": "cold" if cold else "warm"}
    if cold:
        rec["resident_before_drop"] = residency(groups)
        drop(files)
        rec["other_mappers"] = mappers(files)
        if rec["other_mappers"]:
            print(f"warning: {rec['other_mappers']} map {arm}'s files: their pages stay "
                  "cached", file=sys.stderr)
        rec["resident_after_drop"] = residency(groups)
    if arm == LLAMA:
        cmd, env = completion_command(args, prompt, args.startup_tokens), None
    else:
        cmd = burn_command(args, arm, prompt, args.startup_tokens, stream=True)
        env = burn_env(args, arm)
    (child,), _ = run_children([cmd], args.sample_ms / 1e3, env=env)
    rec.update(child.record())
    if cold:
        rec["resident_after_run"] = residency(groups)
    if arm == LLAMA:
        text = child.out.decode(errors="replace")
        rec["text"] = text
        rec["reference_text_prefix"] = (text_matches_reference(text, prompt)
                                        if args.weights == "real"
                                        and prompt.get("generated_text") is not None else None)
        perf = {}
        for key, rx in LLAMA_PERF.items():
            m = rx.search(child.stderr)
            if m:
                perf[key] = float(m[1])
        rec["llama_perf"] = perf
        rec.update({"model_ready_ms": None, "time_to_first_token_ms": None, "prefill_ms": None})
    else:
        m = STREAM_SUMMARY.search(child.stderr)
        if not m:
            raise SystemExit(f"no summary line in generate's stderr:\n{child.stderr}")
        rec.update({"model_ready_ms": float(m[1]), "time_to_first_token_ms": float(m[2]),
                    "decode_tokens": int(m[4]),
                    # the prompt's prefill and first token (and the vocabulary's reading)
                    "prefill_ms": float(m[2]) - float(m[1])})
    return rec


def concurrent(args, arm, prompt, weight_bytes):
    """--concurrent processes at once, each generating --concurrent-tokens (past any end of
    turn, so that they overlap)."""
    n = args.concurrent_tokens
    if arm == LLAMA:
        cmds = [completion_command(args, prompt, n, ignore_eos=True)
                for _ in range(args.concurrent)]
        env = None
    else:
        cmds = [burn_command(args, arm, prompt, n, stream=True, ignore_eos=True)
                for _ in range(args.concurrent)]
        env = burn_env(args, arm)
    children, samples = run_children(cmds, args.sample_ms / 1e3, env=env, pss=True)
    rec = {"processes": args.concurrent, "tokens": n, "program": os.path.basename(cmds[0][0]),
           "samples": len(samples), "weight_bytes": weight_bytes,
           "peak_rss_bytes": [c.peak_rss for c in children],
           "rss_anon_max_sampled_bytes": [c.rss_anon_max for c in children]}
    if samples:
        best = max(samples, key=lambda s: sum(p["Pss"] for p in s))
        for key in ("Pss", "Pss_Anon", "Pss_File", "Pss_Shmem", "Rss"):
            if all(key in p for p in best):
                rec[f"total_{key.lower()}_bytes"] = sum(p[key] for p in best)
        rec["per_process_pss_bytes"] = [p["Pss"] for p in best]
        rec["total_pss_over_weight_bytes"] = rec["total_pss_bytes"] / weight_bytes
    return rec


# --- the machine and the builds ---------------------------------------------------------------

def git_state(repo):
    def git(*a):
        r = subprocess.run(["git", "-C", repo, *a], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None
    status = git("status", "--porcelain")
    return {
        "repo": repo,
        "commit": git("rev-parse", "HEAD"),
        "dirty": bool(status) if status is not None else None,
        "changes": status.splitlines()[:50] if status else [],
    }


def cpu_info():
    model, flags = None, set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model is None:
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    out = {"model_name": model, "logical_cpus": os.cpu_count(), "machine": platform.machine(),
           "kernel": platform.release(), "flags": {f: f in flags for f in CPU_FLAGS}}
    out["flags"]["amx"] = sorted(f for f in flags if f.startswith("amx"))
    return out


def llama_version(binary):
    r = subprocess.run([binary, "--version"], capture_output=True, text=True)
    return (r.stdout + r.stderr).strip()


def ab_arguments(ap, arm_help):
    """The options every A/B run over builds takes (decode_ab.py, cold_start.py)."""
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--random-weights", action="store_true",
                    help="the GGUF's blocks are random (a speed-test file)")
    ap.add_argument("--arm", action="append", required=True, help=arm_help)
    ap.add_argument("--build", action="append", default=[],
                    help="LABEL=TEXT: the commit or build flags an arm's binary came from")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")


def rotations(arms, rounds):
    """(round, label, spec) for every arm in every round, the arms' order rotating by round."""
    for r in range(rounds):
        shift = r % len(arms)
        for label, spec in arms[shift:] + arms[:shift]:
            yield r, label, spec


def ab_record(args, arms):
    """What an A/B run over builds records first (decode_ab.py, cold_start.py): the GGUF, the
    arms and their builds, the run's shape, the machine and llama.cpp's versions."""
    return {
        "gguf": {"path": args.gguf, "size_bytes": os.path.getsize(args.gguf),
                 "weights": "random" if args.random_weights else "real"},
        "arms": dict(arms),
        "builds": dict(c.split("=", 1) for c in args.build),
        "tokens": args.tokens,
        "rounds": args.rounds,
        "threads": args.threads,
        "cpu": cpu_info(),
        "llama_versions": {label: llama_version(spec.partition(":")[2])
                           for label, spec in arms if spec.startswith("llama:")},
    }


def emit(result, path):
    """Prints the result as JSON, and writes it to `path` too where one is given."""
    text = json.dumps(result, indent=1)
    print(text)
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")


# --- summary --------------------------------------------------------------------------------

def spread(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def arm_summary(runs, starts, conc, pps, tokens_list):
    mine = [r for r in runs if r["tokens"] == tokens_list[0]]
    s = {
        # the first --tokens count
        "decode_tokens_per_s": spread([r["decode_tokens_per_s"] for r in mine]),
        "time_to_first_token_ms": spread([r["time_to_first_token_ms"] for r in mine]),
        "model_ready_ms": spread([r["model_ready_ms"] for r in mine]),
        "decode_tokens_per_s_at": {}, "decode_tokens_timed_at": {},
        # burn-mapped: at the end of generation (its own figure); llama.cpp: none
        "rss_anon_bytes": spread([r["rss_anon_bytes"] for r in mine]),
        # every arm: the largest of the parent's samples during the decode run
        "rss_anon_max_sampled_bytes": spread([r["rss_anon_max_sampled_bytes"] for r in mine]),
        "peak_rss_bytes": spread([r["peak_rss_bytes"] for r in mine]),
    }
    for n in tokens_list:
        at = [r for r in runs if r["tokens"] == n]
        s["decode_tokens_per_s_at"][str(n)] = spread([r["decode_tokens_per_s"] for r in at])
        s["decode_tokens_timed_at"][str(n)] = spread([r["decode_tokens"] for r in at])
    if pps:
        s["llama_bench_pp"] = {
            "n_prompt": pps[0]["n_prompt"],
            "tokens_per_s": spread([p["avg_ts"] for p in pps]),
            "ms": spread([p["avg_ns"] / 1e6 for p in pps]),
        }
    for kind in ("warm", "cold"):
        st = [r for r in starts if r["kind"] == kind]
        if not st:
            continue
        s[f"startup_{kind}"] = {
            "spawn_to_first_token_ms": spread([r["spawn_to_first_output_ms"] for r in st]),
            "in_process_time_to_first_token_ms": spread([r["time_to_first_token_ms"] for r in st]),
            "model_ready_ms": spread([r["model_ready_ms"] for r in st]),
            "prefill_ms": spread([r["prefill_ms"] for r in st]),
            "rss_anon_at_first_token_bytes": spread(
                [r["rss_anon_at_first_output_bytes"] for r in st]),
            "rss_anon_max_sampled_bytes": spread([r["rss_anon_max_sampled_bytes"] for r in st]),
            "peak_rss_bytes": spread([r["peak_rss_bytes"] for r in st]),
        }
        if kind == "cold":
            s["startup_cold"]["resident_after_drop"] = spread(
                [r["resident_after_drop"]["all"] for r in st])
        checked = [r["reference_text_prefix"] for r in st if r.get("reference_text_prefix")
                   is not None]
        if checked:
            s[f"startup_{kind}"]["text_equals_reference_prefix"] = f"{sum(checked)}/{len(checked)}"
    if conc:
        s["concurrent"] = {
            "processes": conc[0]["processes"], "program": conc[0]["program"],
            "weight_bytes": conc[0]["weight_bytes"],
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


def prefill_ms(summary):
    """The prefill column: llama-bench's pp P for llama.cpp; warm startup's first token minus
    model-ready for burn-mapped."""
    m = medians(summary)
    return m.get("llama_bench_pp.ms", m.get("startup_warm.prefill_ms"))


def ratios(summary):
    """Ratios of the medians to llama.cpp's (arm / llama.cpp)."""
    if LLAMA not in summary:
        return {}
    ref = medians(summary[LLAMA])
    ref["prefill_ms"] = prefill_ms(summary[LLAMA])
    out = {}
    for arm, s in summary.items():
        if arm == LLAMA:
            continue
        mine = medians(s)
        mine["prefill_ms"] = prefill_ms(s)
        out[arm] = {k: v / ref[k] for k, v in mine.items()
                    if v is not None and ref.get(k) and "resident" not in k}
    return out


def paired_ratios(arms, runs, starts, tokens_list):
    """Per round, arm / llama.cpp within that round: tok/s (the arm's median over the round's
    prompts over llama-bench's tg of the same count) and spawn to first token."""
    if LLAMA not in arms:
        return {}
    tg = {(r["round"], r["tokens"]): r["decode_tokens_per_s"] for r in runs if r["dtype"] == LLAMA}
    first = {(r["round"], r["kind"]): r["spawn_to_first_output_ms"] for r in starts
             if r["dtype"] == LLAMA}
    out = {}
    for arm in arms:
        if arm == LLAMA:
            continue
        mine = {}
        for n in tokens_list:
            per_round = []
            for rnd in sorted({r["round"] for r in runs if r["dtype"] == arm and r["tokens"] == n}):
                vals = [r["decode_tokens_per_s"] for r in runs
                        if r["dtype"] == arm and r["tokens"] == n and r["round"] == rnd]
                if tg.get((rnd, n)):
                    per_round.append(statistics.median(vals) / tg[(rnd, n)])
            if per_round:
                mine[f"decode_tokens_per_s_at.{n}"] = dict(spread(per_round), per_round=per_round)
        for kind in ("warm", "cold"):
            per_round = [r["spawn_to_first_output_ms"] / first[(r["round"], kind)]
                         for r in starts if r["dtype"] == arm and r["kind"] == kind
                         and first.get((r["round"], kind))]
            if per_round:
                mine[f"startup_{kind}.spawn_to_first_token_ms"] = dict(spread(per_round),
                                                                      per_round=per_round)
        out[arm] = mine
    return out


def table(result, prompts):
    summary, ratio, paired = (result["summary"], result["ratios_to_llama_cpp"],
                              result["paired_ratios_to_llama_cpp"])
    mib = 1 << 20
    cols = [(f"tok/s@{n}", f"decode_tokens_per_s_at.{n}", 1, "{:.2f}")
            for n in result["tokens_list"]] + [
        (f"pp{result['llama_pp_tokens']} ms", "prefill_ms", 1, "{:.0f}"),
        ("warm 1st ms", "startup_warm.spawn_to_first_token_ms", 1, "{:.0f}"),
        ("cold 1st ms", "startup_cold.spawn_to_first_token_ms", 1, "{:.0f}"),
        ("cold resid.", "startup_cold.resident_after_drop", 1, "{:.3f}"),
        ("RssAnon MiB", "rss_anon_max_sampled_bytes", mib, "{:.1f}"),
        ("Anon@1st MiB", "startup_warm.rss_anon_at_first_token_bytes", mib, "{:.1f}"),
        ("peak RSS MiB", "peak_rss_bytes", mib, "{:.0f}"),
        (f"Pss MiB x{result['concurrent']}", "concurrent.total_pss_bytes", mib, "{:.0f}"),
        ("Pss/weights", "concurrent.total_pss_over_weight_bytes", 1, "{:.3f}"),
    ]
    w = 14
    print(f"\n{'arm':{w}}" + "".join(f"{c[0]:>13}" for c in cols))
    for arm, s in summary.items():
        m = medians(s)
        m["prefill_ms"] = prefill_ms(s)
        print(f"{arm:{w}}" + "".join(
            f"{fmt.format(m[key] / scale) if m.get(key) is not None else '-':>13}"
            for _, key, scale, fmt in cols))
    for arm, r in ratio.items():
        p = paired.get(arm, {})
        cells = []
        for _, key, _, _ in cols:
            if key in p:
                cells.append(f"{p[key]['median']:.2f}x")
            elif key in r and "resid" not in key:
                cells.append(f"{r[key]:.2f}x")
            else:
                cells.append("-")
        print(f"{arm + ' / llama':{w}}" + "".join(f"{c:>13}" for c in cells))
    print("(medians. tok/s: burn-mapped `generate` over the tokens after the first, llama.cpp "
          "llama-bench tg N; ppP: llama-bench pp P, burn-mapped warm in-process first token "
          "minus model-ready; warm/cold 1st: process spawn to first generated byte on stdout; "
          "RssAnon: largest sample during the decode run; Anon@1st: at the warm run's first "
          "byte; Pss: all processes at once, max over samples. '/ llama' rows: tok/s and "
          "1st ms are per-round paired ratios, the rest ratios of medians)")
    print("\nmedian [min, max] over rounds:")
    for arm, s in summary.items():
        parts = []
        for n in result["tokens_list"]:
            v = s["decode_tokens_per_s_at"].get(str(n))
            if v:
                parts.append(f"tok/s@{n} {v['median']:.2f} [{v['min']:.2f}, {v['max']:.2f}]")
            p = paired.get(arm, {}).get(f"decode_tokens_per_s_at.{n}")
            if p:
                parts.append(f"/llama {p['median']:.2f}x [{p['min']:.2f}, {p['max']:.2f}]")
        for kind in ("warm", "cold"):
            v = s.get(f"startup_{kind}", {}).get("spawn_to_first_token_ms")
            if v:
                parts.append(f"{kind} 1st {v['median']:.0f} [{v['min']:.0f}, {v['max']:.0f}] ms")
        print(f"  {arm:{w}}" + "; ".join(parts))
    print(f"\nweights: {result['model']['weights']}; "
          f"ref {len(prompts[0]['generated_ids'])}: equal (prefix) per prompt; "
          f"equal to f32 of {result['tokens']}; tokens timed per run (median)")
    for arm, s in summary.items():
        if arm == LLAMA:
            st = [s.get(f"startup_{k}", {}).get("text_equals_reference_prefix")
                  for k in ("cold", "warm")]
            st = [x for x in st if x]
            print(f"{arm:{w}}decode not compared (llama-bench's tg decodes random tokens); "
                  f"startup text equals the reference's prefix: "
                  f"{', '.join(st) if st else 'not checked'}")
            continue
        m = medians(s)
        refs = " ".join(f"{r['reference_equal_of_32']}({r['reference_prefix_equal']})"
                        for r in s["per_prompt"])
        f32 = " ".join(str(r.get("f32_equal", "-")) for r in s["per_prompt"])
        timed = " ".join(f"{n}:{m.get(f'decode_tokens_timed_at.{n}', 0):.0f}"
                         for n in result["tokens_list"])
        print(f"{arm:{w}}{refs}; {f32}; {timed}")


def startup_prompt(args, arms, reference):
    """--startup-prompt as a reference-like prompt: text, chat flag and token ids (a repeated
    sentence's ids come from a one-token `generate` run of the first burn-mapped arm)."""
    if args.startup_prompt == "short":
        return reference["prompts"][0]
    if args.startup_prompt == "long":
        return reference["long_prompts"][0]
    kind, _, count = args.startup_prompt.partition(":")
    if kind != "sentence" or not count.isdigit() or int(count) < 1:
        raise SystemExit(f"--startup-prompt {args.startup_prompt!r}: short, long or sentence:N")
    text = " ".join([SENTENCE] * int(count))
    prompt = {"is_chat": False, "text": text, "generated_text": None}
    burn = next((a for a in arms if a != LLAMA), None)
    if burn is None:
        raise SystemExit("--startup-prompt sentence:N needs a burn-mapped arm to count tokens")
    prompt["prompt_ids"] = generate(args, burn, prompt, 1)["prompt_ids"]
    return prompt


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
    p.add_argument("--dtypes", default="q8,f32",
                   help="arms: store dtypes (blocks, q8, f32, f16, bf16), gguf (the GGUF read "
                        "in place) and llama.cpp")
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
    p.add_argument("--startup-prompt", default="short",
                   help="the prompt of the startup runs (and llama-bench's pp): short, the "
                        "reference's prompt 0 (4 tokens); long, its long prompt (681 tokens); "
                        "sentence:N, a plain sentence repeated N times without the chat "
                        "template (N=8: 96 tokens at 0.5B, 97 at 7B; N=40: 480)")
    p.add_argument("--concurrent", type=int, default=4, help="processes at once; 0: none")
    p.add_argument("--concurrent-tokens", type=int, default=128,
                   help="tokens of each concurrent process (prompt 0, past any end of turn)")
    p.add_argument("--concurrent-rounds", type=int, default=1,
                   help="rounds (the first ones) with the concurrent runs")
    p.add_argument("--sample-ms", type=float, default=50,
                   help="sampling period of RssAnon and smaps_rollup")
    p.add_argument("--cache-dir", help="generate --cache-dir (default: its own)")
    p.add_argument("--gguf", help="the GGUF every arm reads: llama.cpp and the gguf arm run it, "
                                  "the store arms are converted from it (default: "
                                  "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf in the cache "
                                  "directory)")
    p.add_argument("--random-weights", action="store_true",
                   help="the GGUF holds random weights (a speed-test file): recorded as "
                        "\"weights\": \"random\", no comparison with the reference")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                   help="threads of every process (llama.cpp's -t, BURN_MAPPED_THREADS; "
                        "default: the CPUs this process may run on)")
    p.add_argument("--ignore-eos", action="store_true",
                   help="every arm generates all --tokens, past end-of-turn tokens")
    p.add_argument("--llama-bench", help="llama.cpp's llama-bench binary (arm llama.cpp)")
    p.add_argument("--llama-completion",
                   help="llama.cpp's llama-completion binary (arm llama.cpp: startup and "
                        "concurrent runs)")
    p.add_argument("--llama-build-flags", default="",
                   help="the cmake flags llama.cpp was built with (recorded)")
    p.add_argument("--llama-reps", type=int, default=1,
                   help="llama-bench -r: repetitions per llama-bench run (tok/s: their mean)")
    p.add_argument("--llama-pp", type=int,
                   help="llama-bench's pp length (default: the startup prompt's token count)")
    p.add_argument("--json", help="also write the JSON object here")
    args = p.parse_args()
    cache = args.cache_dir or os.path.expanduser("~/.cache/burn-mapped")
    args.gguf = os.path.abspath(args.gguf or os.path.join(
        cache, "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))
    args.weights = "random" if args.random_weights else "real"
    tokens_list = [int(t) for t in args.tokens.split(",")]
    long_rounds = args.rounds if args.long_rounds is None else args.long_rounds
    kinds = [k for k in args.startup.split(",") if k]
    if set(kinds) - {"cold", "warm"}:
        raise SystemExit("--startup takes cold, warm")
    arms = args.dtypes.split(",")
    if LLAMA in arms:
        for flag, path in (("--llama-bench", args.llama_bench),
                           ("--llama-completion", args.llama_completion)):
            if not path or not os.access(path, os.X_OK):
                raise SystemExit(f"arm {LLAMA} needs {flag} (an executable), got {path!r}")

    reference = json.load(open(REFERENCE))
    prompts = reference["prompts"]
    start_prompt = startup_prompt(args, arms, reference)
    pp_tokens = args.llama_pp or len(start_prompt["prompt_ids"])
    groups = {}  # arm -> {group: files}: what a cold run drops
    llama = {}
    for arm in arms:
        if arm == LLAMA:
            groups[arm] = {"gguf": [args.gguf]}
            llama["bench_version"] = llama_version(args.llama_bench)
            llama["completion_version"] = llama_version(args.llama_completion)
            (child,), _ = run_children([completion_command(args, prompts[0], 1)],
                                       args.sample_ms / 1e3)
            continue
        got = generate(args, arm, prompts[0], 1)
        if base_arm(arm)[0] == GGUF_ARM:
            if args.device == "cpu" and not got.get("in_place"):
                raise SystemExit("the gguf arm did not read the GGUF in place")
            groups[arm] = {"gguf": [args.gguf]}
        else:
            store = got["store"]
            groups[arm] = {"store": sorted(os.path.join(store, f) for f in os.listdir(store)
                                           if os.path.isfile(os.path.join(store, f))),
                           "gguf": [args.gguf]}
    weight_bytes = {a: sum(os.path.getsize(f) for f in g["store" if "store" in g else "gguf"])
                    for a, g in groups.items()}

    runs, starts, concs, pps = [], [], [], []
    t_begin = time.perf_counter()
    for rnd in range(args.rounds):
        order = arms[rnd % len(arms):] + arms[:rnd % len(arms)]
        for arm in order:
            for kind in sorted(kinds):  # cold, then warm (the pages it needs now cached)
                rec = startup(args, arm, start_prompt, groups[arm], kind == "cold")
                rec.update({"round": rnd, "dtype": arm})
                starts.append(rec)
                print(f"[round {rnd}] {arm} {kind}: first token "
                      f"{rec['spawn_to_first_output_ms']:.0f} ms from spawn", file=sys.stderr)
        for n in tokens_list:
            if n != tokens_list[0] and rnd >= long_rounds:
                continue
            chosen = prompts if n == tokens_list[0] else prompts[:args.long_prompts]
            for i, prompt in enumerate(chosen):
                for arm in order:
                    if arm == LLAMA:
                        if i != 0:  # llama-bench's tg does not read a prompt: once per count
                            continue
                        if n == tokens_list[0]:
                            pp = llama_bench(args, pp_tokens, 0)
                            pp.update({"round": rnd})
                            pps.append(pp)
                            llama.setdefault("build_commit", pp.get("build_commit"))
                            llama.setdefault("build_number", pp.get("build_number"))
                            print(f"[round {rnd}] {arm} pp{pp_tokens}: {pp['avg_ns'] / 1e6:.1f} "
                                  f"ms ({pp['avg_ts']:.1f} tok/s)", file=sys.stderr)
                        tg = llama_bench(args, 0, n)
                        llama.setdefault("bench_config", {
                            k: v for k, v in tg.items()
                            if k not in ("samples_ns", "samples_ts", "avg_ns", "avg_ts",
                                         "stddev_ns", "stddev_ts", "test_time", "parent")})
                        runs.append({
                            "round": rnd, "dtype": arm, "prompt": None, "tokens": n,
                            "program": "llama-bench",
                            "decode_tokens": tg["n_gen"],
                            "decode_tokens_per_s": tg["avg_ts"],
                            "decode_ms": tg["avg_ns"] / 1e6,
                            "time_to_first_token_ms": None, "model_ready_ms": None,
                            "rss_anon_bytes": None,
                            "rss_anon_max_sampled_bytes":
                                tg["parent"]["rss_anon_max_sampled_bytes"],
                            "wall_ms": tg["parent"]["wall_ms"],
                            "peak_rss_bytes": tg["parent"]["peak_rss_bytes"],
                        })
                        print(f"[round {rnd}] {arm} llama-bench tg{n}: "
                              f"{tg['avg_ts']:.2f} tok/s", file=sys.stderr)
                        continue
                    got = generate(args, arm, prompt, n)
                    if got["prompt_ids"] != prompt["prompt_ids"]:
                        if args.weights == "real":
                            raise SystemExit(f"prompt {i}: ids differ from the reference's")
                        print(f"warning: prompt {i}: ids differ from the reference's",
                              file=sys.stderr)
                    ref = prompt["generated_ids"][:REFERENCE_TOKENS]
                    ids = got["generated_ids"]
                    same_ref = next((k for k, (a, b) in enumerate(zip(ids, ref)) if a != b),
                                    min(len(ids), len(ref)))
                    runs.append({
                        "round": rnd, "dtype": arm, "prompt": i, "tokens": n,
                        "program": "burn-mapped generate",
                        "in_place": got.get("in_place"),
                        "copied_bytes": got.get("copied_bytes"),
                        "decode_path": got.get("decode_path"),
                        "decode_tokens": got.get("decode_tokens", len(ids) - 1),
                        "decode_tokens_per_s": got["decode_tokens_per_s"],
                        "time_to_first_token_ms": got["time_to_first_token_ms"],
                        "model_ready_ms": got["model_ready_ms"],
                        "rss_anon_bytes": got["rss_anon_bytes"],
                        "rss_file_bytes": got.get("rss_file_bytes"),
                        "rss_anon_max_sampled_bytes": got["parent"]["rss_anon_max_sampled_bytes"],
                        "wall_ms": got["parent"]["wall_ms"],
                        "peak_rss_bytes": got["parent"]["peak_rss_bytes"],
                        "generated_ids": ids,
                        "reference_prefix_equal": same_ref,
                        "reference_equal": sum(a == b for a, b in zip(ids, ref)),
                    })
                    print(f"[round {rnd}] {arm} prompt {i} {n} tokens: "
                          f"{got['decode_tokens_per_s']:.2f} tok/s over "
                          f"{runs[-1]['decode_tokens']}", file=sys.stderr)
        if args.concurrent and rnd < args.concurrent_rounds:
            for arm in order:
                rec = concurrent(args, arm, prompts[0], weight_bytes[arm])
                rec.update({"round": rnd, "dtype": arm})
                concs.append(rec)
                print(f"[round {rnd}] {arm} x{args.concurrent}: {rec['samples']} samples, "
                      f"total Pss {rec.get('total_pss_bytes', 0) / 2**20:.0f} MiB",
                      file=sys.stderr)

    summary = {}
    f32 = {(r["round"], r["prompt"]): r["generated_ids"] for r in runs
           if r["dtype"] == "f32" and r["tokens"] == tokens_list[0]}
    for arm in arms:
        mine = [r for r in runs if r["dtype"] == arm]
        summary[arm] = arm_summary(
            mine, [r for r in starts if r["dtype"] == arm],
            [c for c in concs if c["dtype"] == arm],
            pps if arm == LLAMA else [], tokens_list)
        if arm == LLAMA:
            summary[arm]["per_prompt"] = None  # llama-bench's tokens are not the model's choice
            continue
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
            if arm != "f32" and (first["round"], i) in f32:
                other = f32[(first["round"], i)]
                row["f32_equal"] = sum(a == b for a, b in zip(first["generated_ids"], other))
                row["of"] = len(other)
            per_prompt.append(row)
        summary[arm]["per_prompt"] = per_prompt
    llama["build_flags"] = args.llama_build_flags
    llama["bench"] = args.llama_bench
    llama["completion"] = args.llama_completion
    result = {
        "device": args.device, "placement": args.placement, "arms": arms,
        "tokens": tokens_list[0], "rounds": args.rounds, "tokens_list": tokens_list,
        "long_prompts": args.long_prompts, "long_rounds": long_rounds, "startup": kinds,
        "startup_tokens": args.startup_tokens, "startup_prompt": args.startup_prompt,
        "startup_prompt_tokens": len(start_prompt["prompt_ids"]), "concurrent": args.concurrent,
        "concurrent_tokens": args.concurrent_tokens,
        "concurrent_rounds": args.concurrent_rounds, "threads": args.threads,
        "ignore_eos": args.ignore_eos, "llama_pp_tokens": pp_tokens,
        "llama_reps": args.llama_reps if LLAMA in arms else None,
        "model": {"path": args.gguf, "name": os.path.basename(args.gguf),
                  "size_bytes": os.path.getsize(args.gguf), "weights": args.weights},
        "gguf": args.gguf,
        "project": dict(git_state(ROOT), bin=os.path.abspath(args.bin)),
        "llama_cpp": llama if LLAMA in arms else None,
        "cpu": cpu_info(), "cpu_count": os.cpu_count(),
        "notes": [
            "llama.cpp decode: llama-bench tg N (random input tokens, not compared with the "
            "reference); its tok/s covers all N tokens, burn-mapped's the N-1 after the first",
            "llama.cpp startup: llama-completion --no-warmup, greedy, spawn to first byte of "
            "generated text on stdout",
            "concurrent runs generate past any end of turn (--ignore-eos) so that they overlap",
        ],
        "weight_bytes": weight_bytes,
        "seconds": time.perf_counter() - t_begin,
        "summary": summary,
        "paired_ratios_to_llama_cpp": paired_ratios(arms, runs, starts, tokens_list),
        "ratios_to_llama_cpp": ratios(summary),
        "runs": runs, "startup_runs": starts, "concurrent_runs": concs,
        "llama_bench_pp_runs": pps,
    }
    text = json.dumps(result, indent=1)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    print(text)
    table(result, prompts)


if __name__ == "__main__":
    main()
