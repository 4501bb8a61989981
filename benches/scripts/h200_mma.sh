#!/usr/bin/env bash
# Issue 4 on the H200: the tensor-core q8 kernel (`burn_mapped::q8::MmaTuning`, f16 cooperative
# matrices on SPIR-V) against the FMA kernel's per-T defaults and PyTorch at T = 1, 2, 4, 8.
# The tensor-core kernel is opt-in (slower than the FMA kernel here, see `MmaTuning`'s docs).
# First the q8 kernel tests on the vulkan backend (`every_tensor_core_shape_matches_the_f64_
# reference` among them, which checks it where the device has f16 cooperative matrices), then
# per round: gemv with the per-T defaults (the FMA kernel), eager and replayed; gemv with the
# FMA shapes `FMA` and the tensor-core shapes `MMA` (`--tunings`, each at every T); then
# PyTorch in the same call; device clock throughout. nvidia-smi samples the SM clock.
# Binaries: `gemv-vulkan.xz` (Fusion), `q8_wgpu-vulkan.xz`.
# One archive under $OUT.
#
#   bash benches/scripts/h200_mma.sh
set -u
LOG_NAME=h200-mma.log
. "$(dirname "$0")/h200_env.sh"

store=/tmp/bm-gemv
FMA="${FMA:-32.4.4.4.4.4,32.4.8.2.4.2}"
MMA="${MMA:-mma.2.8.2,mma.2.8.1,mma.3.4.2,mma.2.4.4,mma.1.8.2,mma.4.2.2}"
sample_clock
run "q8 tests, vulkan (SPIR-V)" "$work/q8_wgpu-vulkan" --test-threads=1
run "gpu warm-up (discarded)" "$work/gemv-vulkan" --device vulkan --store "$store" --arms q8,read --t-sweep 1 --passes 300 --json /dev/null
for round in ${ROUNDS:-1 2}; do
  run "defaults, round $round" "$work/gemv-vulkan" --device vulkan --store "$store" \
    --arms sync,read,q8,readgraph,q8graph --t-sweep 1,2,4,8 --passes 40 --device-time \
    --json "$out/default-r$round.json"
  run "shapes, round $round" "$work/gemv-vulkan" --device vulkan --store "$store" \
    --arms q8 --t-sweep 1,2,4,8 --passes 40 --device-time --tunings "$FMA,$MMA" \
    --json "$out/shapes-r$round.json"
  run "pytorch, round $round" python3 benches/python/gemv_torch.py --arms readf32,fp16,int8pack \
    --t-sweep 1,2,4,8 --passes 40 --json "$out/torch-r$round.json"
done
stop_clock
(cd "$out" && tar czf mma.tgz ./*.json smi.csv "$(basename "$log")" && rm -f ./*.json smi.csv)
