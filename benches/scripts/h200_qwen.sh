#!/usr/bin/env bash
# Qwen2.5-Coder-0.5B (the real Q4_K_M GGUF) decoding on the H200 through Burn's `vulkan` backend
# (SPIR-V, Fusion): the q8 store (int8 projections through the dp4a kernel, one activation split
# shared by q/k/v and by gate/up) against the f32 store, both resident, 64 greedy tokens on the
# four prompts of the float64 reference, each generation in its own process
# (`benches/python/qwen_decode.py`). The GGUF is too large for one call's transfer, so earlier
# calls leave it in pieces under PARTS (default /tmp/devcache: the machine's /tmp survives between
# calls while it stays warm, ignored paths of the repository do not), one carried piece each:
# `split -n 9 -d qwen2.5-coder-0.5b-instruct-q4_k_m.gguf gguf.part`. The CLI checks its size and
# SHA-256 before converting. Binary: `burn-mapped-vulkan.xz` (tools, features vulkan +
# fusion). One archive under $OUT.
#
#   bash benches/scripts/h200_qwen.sh     (ROUNDS=2 by default; the run here used ROUNDS=1)
set -u
LOG_NAME=h200-qwen.log
. "$(dirname "$0")/h200_env.sh"

cache=/tmp/bm-cache
mkdir -p "$cache"
cat "${PARTS:-/tmp/devcache}"/gguf.part* > "$cache/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
sample_clock
run "decode, vulkan, resident" python3 benches/python/qwen_decode.py --bin "$work/burn-mapped-vulkan" \
  --device vulkan --placement resident --rounds "${ROUNDS:-2}" --cache-dir "$cache" \
  --json "$out/qwen-vulkan.json"
stop_clock
(cd "$out" && tar czf qwen.tgz ./*.json smi.csv "$(basename "$log")" && rm -f ./*.json smi.csv)
