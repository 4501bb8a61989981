#!/usr/bin/env bash
# Qwen2.5-Coder-0.5B (the real Q4_K_M GGUF) decoding on the H200 through Burn's `vulkan` backend
# (SPIR-V, Fusion): the q8 store (int8 projections through the dp4a kernel, one activation split
# shared by q/k/v and by gate/up) against the f32 store, both resident, 64 greedy tokens on the
# four prompts of the float64 reference, each generation in its own process
# (`benches/python/qwen_decode.py`). See h200_env.sh for BIN, OUT and WORK. The binary:
#
#   cargo build --release -p burn-mapped-tools --bin burn-mapped --features vulkan,burn-mapped/fusion   # -> burn-mapped-vulkan
#
# The GPU host needs the checkpoint but no network: GGUF names the file (docs/CHECKPOINT.md), or
# PARTS a folder of pieces made by `split -n 9 -d qwen2.5-coder-0.5b-instruct-q4_k_m.gguf gguf.part`
# for hosts that take files in smaller transfers. The CLI checks its size and SHA-256 before
# converting. The figures in docs/GPU.md came from ROUNDS=1 (default 2); results:
# benches/results/h200/qwen/.
#
#   GGUF=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf bash benches/scripts/h200_qwen.sh
set -u
LOG_NAME=h200-qwen.log
. "$(dirname "$0")/h200_env.sh"

cache="${CACHE:-/tmp/bm-cache}"
mkdir -p "$cache"
gguf="$cache/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
if [ -n "${GGUF:-}" ]; then
  cp "$GGUF" "$gguf"
elif [ -n "${PARTS:-}" ]; then
  cat "$PARTS"/gguf.part* > "$gguf"
fi
sample_clock
run "decode, vulkan, resident" python3 benches/python/qwen_decode.py --bin "$work/burn-mapped-vulkan" \
  --device vulkan --placement resident --rounds "${ROUNDS:-2}" --cache-dir "$cache" \
  --json "$out/qwen-vulkan.json"
stop_clock
(cd "$out" && tar czf qwen.tgz ./*.json smi.csv "$(basename "$log")" && rm -f ./*.json smi.csv)
