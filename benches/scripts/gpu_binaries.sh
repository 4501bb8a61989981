#!/usr/bin/env bash
# Long decodes (tg1024) of several `burn-mapped` builds against llama.cpp CUDA (flash attention
# on) on one GPU in one call, the arms rotating by round: what a change to the device step does
# to decode at long contexts, each build timed beside the others on the same card.
#
# devrun/ holds: bins.tar.xz (stripped `burn-mapped` builds named bm-<arm>, each
# `cargo build --release -p burn-mapped-tools --bin burn-mapped --features vulkan,burn-mapped/fusion`
# at the commit it stands for; one xz of all of them, `--lzma2=preset=9e,dict=256MiB`, shares
# what the builds have in common), llama.tar.xz, gguf-*.whl, header.gguf.xz and gl/*.deb as
# benches/scripts/h200_decode.sh describes. ARMS names the builds (default "main new span64").
#
#   OUT=out bash benches/scripts/gpu_tg1024_binaries.sh
set -u
export PYTHONUNBUFFERED=1
for f in devrun/gl/*.deb; do dpkg -x "$f" /; done; ldconfig
for icd in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json /usr/share/vulkan/icd.d/nvidia_icd.json; do
  if [ -f "$icd" ]; then export VK_DRIVER_FILES="$icd"; break; fi
done
w=/tmp/bm3; mkdir -p $w/llama
tar xJf devrun/llama.tar.xz -C $w/llama
(cmake -S $w/llama/llama.cpp -B $w/llama/build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF && cmake --build $w/llama/build --target llama-bench -j 16) > $OUT/llama-build.log 2>&1 &
build=$!
xz -dc devrun/bins.tar.xz | tar xf - -C $w
python3 -m pip install --no-index --no-deps -q devrun/gguf-*.whl
xz -dc devrun/header.gguf.xz > $w/header.gguf
python3 benches/python/speed_gguf.py $w/header.gguf $w/speed.gguf 491400064 || exit 1
wait $build; echo "llama build $?"; tail -1 $OUT/llama-build.log
gpu="$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"; echo "$gpu"
read -r -a arms <<< "${ARMS:-main new span64} llama"
n=${#arms[@]}
for r in 0 1 2; do
  for i in $(seq 0 $((n - 1))); do
    a=${arms[$(( (i + r) % n ))]}
    if [ $a = llama ]; then x="--bin $w/bm-${arms[0]} --llama-bench $w/llama/build/bin/llama-bench --arms llama-fa1"
    else x="--bin $w/bm-$a --arms q8-step"; fi
    python3 benches/python/gpu_decode.py $x --gguf $w/speed.gguf --tokens 1024 --rounds 1 --long-prompt 0 \
      --cache-dir $w/cache --label "0.5B speed-test GGUF, random blocks, tg1024, binary $a" --commit "$a" \
      --gpu "$gpu" --json $w/tg1024-$a-r$r.json > $w/tg1024-$a-r$r.log 2>&1 || tail -5 $w/tg1024-$a-r$r.log
  done
done
# One file back (the device returns few files): every round's record, and medians per arm.
W=$w ARMS="${arms[*]}" python3 - <<'PY' | tee $OUT/tg1024-binaries.txt
import json, glob, os, statistics
w, out = os.environ["W"], os.environ["OUT"]
runs, summary = {}, {}
for a in os.environ["ARMS"].split():
    v = []
    for f in sorted(glob.glob(f"{w}/tg1024-{a}-r*.json")):
        d = json.load(open(f))
        runs[os.path.basename(f)] = d
        for arm, recs in d["records"].items():
            v += [r["tok_s"] for r in recs]
    if v:
        summary[a] = {"tok_s": v, "median": statistics.median(v), "min": min(v), "max": max(v)}
    print(a, [round(x, 1) for x in v], "median", round(statistics.median(v), 1) if v else None)
with open(f"{out}/tg1024-binaries.json", "w") as f:
    json.dump({"summary": summary, "runs": runs}, f, indent=1)
PY
