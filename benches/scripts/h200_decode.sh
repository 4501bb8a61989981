#!/usr/bin/env bash
# Single-stream decode on one GPU host, side by side in one call (benches/python/gpu_decode.py):
# `burn-mapped generate --device vulkan` on the q8 store through the device step (with its device
# time per token, `--device-time`) and through tensor ops, and on the f32 store, against
# llama.cpp CUDA's `llama-bench -ngl 99 -p 0 -n 128`
# with flash attention off and on, all on one speed-test GGUF (decode speed does not depend on
# the weights' values). The host needs no network and no Rust toolchain; DEVRUN is a folder of:
#
#   burn-mapped-vulkan.xz   cargo build --release -p burn-mapped-tools --bin burn-mapped \
#                               --features vulkan,burn-mapped/fusion   (stripped, xz)
#   header.gguf.xz          the checkpoint's first 5,947,776 bytes (its header)
#   speed_gguf.py           fills a full-size GGUF from that header with random blocks
#   gguf-*.whl              the `gguf` Python package speed_gguf.py imports
#   llama.tar.xz            llama-cpp-python's vendor/llama.cpp (without models, docs, tests,
#                           examples)
#   gl/*.deb                a Vulkan loader for hosts without one (libvulkan1 libegl1 libglvnd0
#                           libopengl0 libgl1 libglx0 libgles2)
#
#   DEVRUN=target/devrun OUT=h200-out bash benches/scripts/h200_decode.sh
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

echo "== speed-test GGUF ($(date -u +%T))"
python3 -m pip install --no-index --no-deps -q "$devrun"/gguf-*.whl
xz -dc "$devrun/header.gguf.xz" > "$work/header.gguf"
# A failed fill would leave the header's zeros as weights: stop rather than time those.
python3 "$devrun/speed_gguf.py" "$work/header.gguf" "$work/speed.gguf" 491400064 \
  || { echo "speed_gguf.py failed"; exit 1; }
xz -dc "$devrun/burn-mapped-vulkan.xz" > "$work/burn-mapped"
chmod +x "$work/burn-mapped"

wait "$build"
echo "llama.cpp build exit $? ($(date -u +%T))"
tail -3 "$out/llama-build.log"

echo "== decode ($(date -u +%T))"
python3 benches/python/gpu_decode.py --bin "$work/burn-mapped" --llama-bench "$bench" \
  --gguf "$work/speed.gguf" --tokens "${TOKENS:-128}" --rounds "${ROUNDS:-3}" \
  --cache-dir "$work/cache" --json "$out/gpu-decode.json"
echo "decode exit $? ($(date -u +%T))"
