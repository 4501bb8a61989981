#!/usr/bin/env bash
# Decodes of several `burn-mapped` builds and arms against llama.cpp CUDA (flash attention on)
# on one GPU in one call, the arms rotating by round: what a change to the device step does,
# each build timed beside the others on the same card, on one or both speed-test GGUFs.
#
# devrun/ holds: bins.tar.xz (stripped `burn-mapped` builds named bm-<build>, each
# `cargo build --release -p burn-mapped-tools --bin burn-mapped --features vulkan,burn-mapped/fusion`
# at the commit it stands for; one xz of all of them, `--lzma2=preset=9e,dict=256MiB`, shares
# what the builds have in common), llama.tar.xz, gguf-*.whl, header.gguf.xz and gl/*.deb as
# benches/scripts/h200_decode.sh describes.
#
# ARMS: `<build>[:<arm>]` entries (arm as benches/python/gpu_decode.py names them, default
# q8-step; `gguf-step` is the GGUF read in place, its blocks on the device) and `llama`;
# default "main new span64 llama"; llama.cpp is built only where an arm is `llama`. SIZES:
# 0.5b and/or 7b (default 0.5b; 7b is made from benches/data's header); ARMS_7B overrides
# ARMS for 7b. TOKENS (default 1024), ROUNDS (3). LONG (default 0): each arm's first token also
# on the plain sentence repeated LONG times (40: ~480 tokens), with the prompt's own ms.
#
#   OUT=out bash benches/scripts/gpu_binaries.sh                     # the tg1024 comparison
#   OUT=out SIZES="7b 0.5b" TOKENS=128 ROUNDS=2 ARMS="a:gguf-step a:q8-step llama" \
#     ARMS_7B="a:gguf-step b:gguf-step llama" bash benches/scripts/gpu_binaries.sh
set -u
export PYTHONUNBUFFERED=1
for f in devrun/gl/*.deb; do dpkg -x "$f" /; done; ldconfig
for icd in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json /usr/share/vulkan/icd.d/nvidia_icd.json; do
  if [ -f "$icd" ]; then export VK_DRIVER_FILES="$icd"; break; fi
done
w=/tmp/bm3; mkdir -p $w/llama
# llama.cpp is built (in the background) only where an arm runs it.
build=
if [[ " ${ARMS:-main new span64 llama} ${ARMS_7B:-} " == *" llama "* ]]; then
  tar xJf devrun/llama.tar.xz -C $w/llama
  (cmake -S $w/llama/llama.cpp -B $w/llama/build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF && cmake --build $w/llama/build --target llama-bench -j 16) > $OUT/llama-build.log 2>&1 &
  build=$!
fi
xz -dc devrun/bins.tar.xz | tar xf - -C $w
python3 -m pip install --no-index --no-deps -q devrun/gguf-*.whl
sizes="${SIZES:-0.5b}"
for size in $sizes; do
  case "$size" in
    0.5b) header=devrun/header.gguf.xz; total=491400064 ;;
    7b) header=benches/data/deepseek-r1-distill-qwen-7b-q4_k_m.header.gguf.xz; total=4683073248 ;;
    *) echo "unknown size $size"; exit 1 ;;
  esac
  xz -dc $header > $w/header-$size.gguf
  python3 benches/python/speed_gguf.py $w/header-$size.gguf $w/speed-$size.gguf $total || exit 1
done
if [ -n "$build" ]; then wait $build; echo "llama build $?"; tail -1 $OUT/llama-build.log; fi
gpu="$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"; echo "$gpu"
tokens=${TOKENS:-1024}
for size in $sizes; do
  spec="${ARMS:-main new span64 llama}"
  [ $size = 7b ] && spec="${ARMS_7B:-$spec}"
  read -r -a arms <<< "$spec"
  n=${#arms[@]}
  first=${arms[0]%%:*}
  for r in $(seq 0 $((${ROUNDS:-3} - 1))); do
    for i in $(seq 0 $((n - 1))); do
      a=${arms[$(( (i + r) % n ))]}
      if [ $a = llama ]; then x="--bin $w/bm-$first --llama-bench $w/llama/build/bin/llama-bench --arms llama-fa1"
      else
        b=${a%%:*}; arm=q8-step; [ "$b" != "$a" ] && arm=${a#*:}
        x="--bin $w/bm-$b --arms $arm"
      fi
      tag=$size-${a/:/-}-r$r
      python3 benches/python/gpu_decode.py $x --gguf $w/speed-$size.gguf --tokens $tokens --rounds 1 \
        --long-prompt ${LONG:-0} --cache-dir $w/cache-$size \
        --label "$size speed-test GGUF, random blocks, tg$tokens, $a" --commit "$a" \
        --gpu "$gpu" --json $w/run-$tag.json > $w/run-$tag.log 2>&1 || tail -5 $w/run-$tag.log
    done
  done
done
# One file back (the device returns few files): every round's record, and medians per arm.
W=$w SIZES="$sizes" python3 - <<'PY' | tee $OUT/binaries.txt
import json, glob, os, re, statistics
w, out = os.environ["W"], os.environ["OUT"]
runs, summary = {}, {}
for f in sorted(glob.glob(f"{w}/run-*.json")):
    d = json.load(open(f))
    runs[os.path.basename(f)] = d
    key = re.sub(r"^run-|-r\d+\.json$", "", os.path.basename(f))
    s = summary.setdefault(key, {"tok_s": [], "first_token_ms": [], "prompt_ms": [],
                                 "long_first_token_ms": [], "long_prompt_ms": [],
                                 "first_use": d.get("first_use")})
    for recs in d["records"].values():
        s["tok_s"] += [r["tok_s"] for r in recs]
    for fts in d["first_token"].values():
        s["first_token_ms"] += [ft["wall_ms"] for ft in fts]
        s["prompt_ms"] += [ft["prompt_ms"] for ft in fts]
    for fts in d.get("first_token_long", {}).values():
        s["long_first_token_ms"] += [ft["wall_ms"] for ft in fts]
        s["long_prompt_ms"] += [ft["prompt_ms"] for ft in fts]
for key, s in summary.items():
    v = s["tok_s"]
    s["median"], s["min"], s["max"] = statistics.median(v), min(v), max(v)
    ft = s["first_token_ms"]
    print(f"{key:28} tok/s {[round(x, 1) for x in v]} median {s['median']:.1f}"
          f" | first token ms {[round(x) for x in ft]} (prompt {[round(x) for x in s['prompt_ms']]})"
          f" | long {[round(x) for x in s['long_first_token_ms']]}"
          f" (prompt {[round(x) for x in s['long_prompt_ms']]}) | first use {s['first_use']}")
with open(f"{out}/binaries.json", "w") as f:
    json.dump({"summary": summary, "runs": runs}, f, indent=1)
PY
