#!/usr/bin/env bash
# What a user waits for on one GPU, in one call: `burn-mapped generate` (each build in
# devrun/bins.tar.xz, named bm-<build>) against llama.cpp CUDA (flash attention on) on the
# speed-test GGUFs of Qwen2.5-Coder-0.5B and the 7B shape, random blocks. Per size and build: a
# new process per first token on the chat prompt and on the plain sentence repeated 40 and 160
# times (~480 and ~1920 tokens), timed from spawn to exit as llama.cpp's are, two rounds
# alternating builds, compiled kernels kept (a warm-up run first, the driver's shader cache in a
# folder of its own); the same three prompts from an empty kernel cache and driver cache; the
# ~1920-token prompt once more with --device-time (`prompt_device_us` whole,
# `prompt_device_us_by_launch`); tg128 and tg1024, TG_ROUNDS rounds (2 unless set) alternating
# builds. llama.cpp: `llama-bench -p 42,481,1921,512 -n 0 -r 3` and `-p 0 -n 128,1024 -r 2`, and
# a new `llama-bench -p P -n 0 -r 1 --no-warmup` process per prompt, timed from spawn to exit,
# twice. llama.cpp is built first: nothing is timed while it compiles. COMMITS
# ("new=<sha> base=<sha>") is recorded as given. devrun/ holds what
# benches/scripts/gpu_binaries.sh describes.
#
#   OUT=out BINS="new base" COMMITS="new=<sha> base=<sha>" [TG_ROUNDS=2] bash benches/scripts/gpu_prompt.sh
set -u
export PYTHONUNBUFFERED=1
BINS="${BINS:-new}"
TG_ROUNDS="${TG_ROUNDS:-2}"
for f in devrun/gl/*.deb; do dpkg -x "$f" /; done; ldconfig
for icd in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json /usr/share/vulkan/icd.d/nvidia_icd.json; do
  if [ -f "$icd" ]; then export VK_DRIVER_FILES="$icd"; break; fi
done
w=/tmp/bm3; mkdir -p $w/llama $w/res
echo "${COMMITS:-}" > $w/res/commits.txt
finish() { tar cJf $OUT/results.tar.xz -C $w res; }
trap finish EXIT
tar xJf devrun/llama.tar.xz -C $w/llama
(cmake -S $w/llama/llama.cpp -B $w/llama/build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF && cmake --build $w/llama/build --target llama-bench -j 16) > $w/res/llama-build.log 2>&1 &
build=$!
xz -dc devrun/bins.tar.xz | tar xf - -C $w
python3 -m pip install --no-index --no-deps -q devrun/gguf-*.whl
xz -dc devrun/header.gguf.xz > $w/header-0.5b.gguf
python3 benches/python/speed_gguf.py $w/header-0.5b.gguf $w/speed-0.5b.gguf 491400064
xz -dc benches/data/deepseek-r1-distill-qwen-7b-q4_k_m.header.gguf.xz > $w/header-7b.gguf
python3 benches/python/speed_gguf.py $w/header-7b.gguf $w/speed-7b.gguf 4683073248
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee $w/res/gpu.txt
S="Write a Python function that checks whether a number is prime."
p40=$(python3 -c "print(' '.join(['$S']*40))"); p160=$(python3 -c "print(' '.join(['$S']*160))")
one() { # build size tag [cache-dir] args...
  local b=$1 size=$2 tag=$3 cache=$w/cache-$2; shift 3
  local driver=$w/driver-cache
  # A cold run starts with the driver's own shader cache empty too (NVIDIA keeps compiled
  # pipelines on disk by itself), as a machine's first process does.
  if [ "${1:-}" = --cold ]; then cache=$w/cold; rm -rf $cache; driver=$cache/driver; shift; fi
  # The driver keeps nothing where its folder is missing: every process would build every
  # pipeline again, kernels kept or not.
  mkdir -p $driver
  local t0=$EPOCHREALTIME
  __GL_SHADER_DISK_CACHE_PATH=$driver timeout 90 $w/bm-$b generate --model $w/speed-$size.gguf --device vulkan --placement resident --max-tokens 2 \
    --ignore-eos --json --cache-dir $cache "$@" 2>$w/res/$tag.err | tail -1 > $w/res/$tag.json
  # Spawn to exit, as llama.cpp's process walls below are timed.
  python3 -c "print(round(($EPOCHREALTIME - $t0) * 1e3, 1))" > $w/res/$tag.wall
  python3 - "$w/res/$tag" <<'PY'
import json, sys
t = sys.argv[1]
try: s = json.load(open(t + ".json"))
except Exception: print(t.split("/")[-1], "FAILED", open(t + ".err").read()[-400:]); sys.exit()
print(t.split("/")[-1], "wall", open(t + ".wall").read().strip(), "open", round(s.get("device_open_ms") or 0),
      "ready", round(s["model_ready_ms"]), "ttft", round(s["time_to_first_token_ms"]),
      "prompt", len(s.get("prompt_ids", [])), s.get("decode_path"))
k = s.get("prompt_device_us_by_launch")
if k: print("   prompt device ms:", round(s["prompt_device_us"] / 1e3, 1) if s.get("prompt_device_us") else "-", "by launch:",
           ", ".join(f"{n} {v/1e3:.1f}" for n, v in k), "sum", round(sum(v for _, v in k) / 1e3, 1))
PY
}
# Nothing is timed while llama.cpp compiles: its sixteen jobs would slow our loads and the
# driver's pipeline builds.
wait $build; echo "llama build $?"
for size in 7b 0.5b; do
  for b in $BINS; do one $b $size warm-$b-$size --prompt "$p160" >/dev/null; one $b $size warm2-$b-$size --chat --prompt "$S" >/dev/null; done
  for r in 0 1; do for b in $BINS; do
    one $b $size $b-$size-chat-r$r --chat --prompt "$S"
    one $b $size $b-$size-480-r$r --prompt "$p40"
    one $b $size $b-$size-1920-r$r --prompt "$p160"
  done; done
  for b in $BINS; do one $b $size prof-$b-$size-1920 --prompt "$p160" --device-time; done
  for b in $BINS; do
    one $b $size cold-$b-$size-chat --cold --chat --prompt "$S"
    one $b $size cold-$b-$size-480 --cold --prompt "$p40"
    one $b $size cold-$b-$size-1920 --cold --prompt "$p160"
  done
  for r in $(seq 0 $((TG_ROUNDS - 1))); do for b in $BINS; do for n in 128 1024; do
    __GL_SHADER_DISK_CACHE_PATH=$w/driver-cache timeout 90 $w/bm-$b generate --model $w/speed-$size.gguf \
      --device vulkan --placement resident --max-tokens $((n + 1)) --ignore-eos --json --cache-dir $w/cache-$size --chat --prompt "$S" \
      2>/dev/null | tail -1 > $w/res/tg$n-$b-$size-r$r.json
  done; done; done
done
for size in 7b 0.5b; do
  timeout 120 $w/llama/build/bin/llama-bench -m $w/speed-$size.gguf -ngl 99 -fa 1 -p 42,481,1921,512 -n 0 -r 3 -o json > $w/res/llama-pp-$size.json 2>/dev/null
  timeout 60 $w/llama/build/bin/llama-bench -m $w/speed-$size.gguf -ngl 99 -fa 1 -p 0 -n 128,1024 -r 2 -o json > $w/res/llama-tg-$size.json 2>/dev/null
  # A new llama.cpp process per prompt, as each burn-mapped first token is: its wall time.
  for r in 0 1; do for p in 42 481 1921; do
    python3 -c "import subprocess, sys, time; t = time.perf_counter(); subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60); print(round((time.perf_counter() - t) * 1e3, 1))" \
      $w/llama/build/bin/llama-bench -m $w/speed-$size.gguf -ngl 99 -fa 1 -p $p -n 0 -r 1 --no-warmup > $w/res/llama-wall-$size-$p-r$r.txt
  done; done
done
W=$w BINS="$BINS" python3 benches/python/gpu_prompt_summary.py | tee $w/res/summary.txt
