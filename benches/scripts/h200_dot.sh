#!/usr/bin/env bash
# Issue 4 on the H200: the dp4a q8 kernel (`burn_mapped::q8::DotTuning`: activations split
# into 16-bit integers per block of 16, packed int8 dot products) against the FMA kernel and
# PyTorch at T = 1, 2, 4, 8. First the q8 kernel tests on the vulkan backend (the dp4a test
# among them, and the default-launch tests under whatever the defaults now take), then per
# round: gemv with the per-T defaults, eager and replayed; gemv replaying the FMA shapes `FMA` and
# the dp4a shapes `DOT` (`--tunings`, each at every T: replays keep the SM clock up, eager
# launches let it fall, see smi.csv of h200/dot/planes-eager); then PyTorch in the same call; device
# clock throughout. nvidia-smi samples the SM clock.
# Binaries: `gemv-vulkan.xz` (Fusion), `q8_wgpu-vulkan.xz`, `burn_mapped_lib-vulkan.xz`.
# One archive under $OUT.
#
#   bash benches/scripts/h200_dot.sh       (ROUNDS="1 2" by default; SKIP_TESTS=1 skips the tests)
set -u
LOG_NAME=h200-dot.log
. "$(dirname "$0")/h200_env.sh"

store=/tmp/bm-gemv
FMA="${FMA:-32.4.4.4.4.4,32.4.8.2.4.2}"
DOT="${DOT:-dot.32.4.2.4,dot.64.2.4.2,dot.32.4.4.4,dot.32.4.8.1,dot.32.2.8.2,dot.32.8.4.2,dot.32.4.8.2,dot.32.2.8.1,dot.32.1.8.2,dot.32.2.12.1,dot.32.2.6.2,dot.32.4.6.2,dot.64.1.8.2,dot.32.2.4.4,dot.64.4.2.2,dot.32.8.2.4}"
sample_clock
if [ -z "${SKIP_TESTS:-}" ]; then
  run "q8 tests, vulkan (SPIR-V)" "$work/q8_wgpu-vulkan" --test-threads=1
  run "q8 lib tests, vulkan" "$work/burn_mapped_lib-vulkan" q8:: --test-threads=1
fi
run "gpu warm-up (discarded)" "$work/gemv-vulkan" --device vulkan --store "$store" --arms q8,read --t-sweep 1 --passes 300 --json /dev/null
for round in ${ROUNDS:-1 2}; do
  run "defaults, round $round" "$work/gemv-vulkan" --device vulkan --store "$store" \
    --arms sync,read,q8,readgraph,q8graph --t-sweep 1,2,4,8 --passes 40 --device-time \
    --json "$out/default-r$round.json"
  run "shapes, round $round" "$work/gemv-vulkan" --device vulkan --store "$store" \
    --arms q8graph --t-sweep 1,2,4,8 --passes 40 --device-time --tunings "$FMA,$DOT" \
    --json "$out/shapes-r$round.json"
  run "pytorch, round $round" python3 benches/python/gemv_torch.py --arms readf32,fp16,int8pack \
    --t-sweep 1,2,4,8 --passes 40 --json "$out/torch-r$round.json"
done
stop_clock
(cd "$out" && tar czf dot.tgz ./*.json smi.csv "$(basename "$log")" && rm -f ./*.json smi.csv)
