#!/usr/bin/env bash
# Single-stream decode on one GPU host, both model sizes, side by side in one call
# (benches/python/gpu_decode.py): `burn-mapped generate --device vulkan` on the q8 store through
# the device step (with its device time per token, `--device-time`) and through tensor ops, and
# on the f32 store, against llama.cpp CUDA's `llama-bench -ngl 99 -p 0 -n 128` with flash
# attention off and on, each on a speed-test GGUF (decode speed does not depend on the weights'
# values; benches/python/speed_gguf.py fills a real header with random blocks):
#
#   0.5b  Qwen2.5-Coder-0.5B-Instruct Q4_K_M: the checkpoint's first 5,947,776 bytes
#   7b    DeepSeek-R1-Distill-Qwen-7B Q4_K_M (Qwen2: hidden 3584, MLP 18944, GQA 28/4):
#         benches/data/deepseek-r1-distill-qwen-7b-q4_k_m.header.gguf.xz
#
# The host needs no network and no Rust toolchain; DEVRUN is a folder of:
#
#   burn-mapped-vulkan.xz   cargo build --release -p burn-mapped-tools --bin burn-mapped \
#                               --features vulkan,burn-mapped/fusion   (stripped, xz)
#   header.gguf.xz          the 0.5B checkpoint's header (above)
#   gguf-*.whl              the `gguf` Python package speed_gguf.py imports
#   llama.tar.xz            llama-cpp-python 0.3.36's vendor/llama.cpp (without models, docs,
#                           tests, examples)
#   gl/*.deb                a Vulkan loader for hosts without one (libvulkan1 libegl1 libglvnd0
#                           libopengl0 libgl1 libglx0 libgles2)
#
#   COMMIT=$(git rev-parse --short HEAD) DEVRUN=target/devrun OUT=h200-out \
#     bash benches/scripts/h200_decode.sh
#
# SIZES (default "0.5b 7b"), TOKENS (128), ROUNDS (3); ARMS_0_5B and ARMS_7B pick the arms;
# GGUF or PARTS add the token check on the real checkpoint (end of the script).
set -u
devrun="${DEVRUN:-target/devrun}"
out="${OUT:-$PWD/h200-out}"
work="${WORK:-/tmp/bm-decode}"
mkdir -p "$out" "$work"
log="$out/h200-decode.log"
: > "$log"
exec > >(tee -a "$log") 2>&1

for f in "$devrun"/gl/*.deb; do [ -f "$f" ] && dpkg -x "$f" /; done
ldconfig
for icd in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json /usr/share/vulkan/icd.d/nvidia_icd.json; do
  if [ -f "$icd" ]; then export VK_DRIVER_FILES="$icd"; break; fi
done
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv

echo "== llama.cpp build ($(date -u +%T))"
bench="$work/llama/build/bin/llama-bench"
mkdir -p "$work/llama"
[ -x "$bench" ] || tar xJf "$devrun/llama.tar.xz" -C "$work/llama"
([ -x "$bench" ] || (cmake -S "$work/llama/llama.cpp" -B "$work/llama/build" -G Ninja -DGGML_CUDA=ON \
   -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
   -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
   && cmake --build "$work/llama/build" --target llama-bench -j 16)) > "$out/llama-build.log" 2>&1 &
build=$!

echo "== speed-test GGUFs ($(date -u +%T))"
python3 -m pip install --no-index --no-deps -q "$devrun"/gguf-*.whl
xz -dc "$devrun/burn-mapped-vulkan.xz" > "$work/burn-mapped"
chmod +x "$work/burn-mapped"
sizes="${SIZES:-0.5b 7b}"
for size in $sizes; do
  case "$size" in
    0.5b) header="$devrun/header.gguf.xz"; total=491400064 ;;
    7b) header=benches/data/deepseek-r1-distill-qwen-7b-q4_k_m.header.gguf.xz; total=4683073248 ;;
    *) echo "unknown size $size"; exit 1 ;;
  esac
  xz -dc "$header" > "$work/header-$size.gguf"
  # A failed fill would leave the header's zeros as weights: stop rather than time those.
  python3 benches/python/speed_gguf.py "$work/header-$size.gguf" "$work/speed-$size.gguf" "$total" \
    || { echo "speed_gguf.py failed"; exit 1; }
done

wait "$build"
echo "llama.cpp build exit $? ($(date -u +%T))"
tail -3 "$out/llama-build.log"
gpu="$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"

for size in $sizes; do
  case "$size" in
    0.5b) arms="${ARMS_0_5B:-q8-step,q8-step-cold,q8-ops,f32-ops,llama-fa0,llama-fa1}"
          label="Qwen2.5-Coder-0.5B-Instruct Q4_K_M, random blocks" ;;
    7b) arms="${ARMS_7B:-q8-step,llama-fa0,llama-fa1}"
        label="DeepSeek-R1-Distill-Qwen-7B Q4_K_M (Qwen2), random blocks" ;;
  esac
  echo "== decode $size ($(date -u +%T))"
  python3 benches/python/gpu_decode.py --bin "$work/burn-mapped" --llama-bench "$bench" \
    --gguf "$work/speed-$size.gguf" --tokens "${TOKENS:-128}" --rounds "${ROUNDS:-3}" \
    --arms "$arms" --cache-dir "$work/cache-$size" --label "$label" \
    --commit "${COMMIT:-unknown}" --gpu "$gpu" --json "$out/gpu-decode-$size.json"
  echo "decode $size exit $? ($(date -u +%T))"
done

# With GGUF (the real checkpoint) or PARTS (a folder of its pieces, `gguf.part*`, for hosts that
# take files in smaller transfers): the float64 reference's four prompts through the device step
# and through tensor ops, 32 greedy tokens each, against the reference's tokens.
if [ -n "${GGUF:-}${PARTS:-}" ]; then
  real="$work/real.gguf"
  if [ -n "${GGUF:-}" ]; then cp "$GGUF" "$real"; else cat "$PARTS"/gguf.part* > "$real"; fi
  echo "== real checkpoint, tokens against the reference ($(date -u +%T))"
  python3 benches/python/gpu_reference.py "$work/burn-mapped" "$real" "$work/cache-real" \
    > "$out/reference-tokens.jsonl"
  echo "reference exit $? ($(date -u +%T))"
fi
