#!/usr/bin/env bash
# Issue 4 on the H200: the per-T launch shapes (`CubeTuning::default_for`), eager and replayed,
# against PyTorch at T = 1, 2, 4, 8, with the SM clock on record.
#
# The T-sweeps (h200_tsweep.sh, h200_tdiag.sh) found the GPU's SM clock moving between 345 and
# 1980 MHz under this benchmark's load (one pass, then a sync: the GPU idles between passes and
# while the host compiles a shader), which swings the compute-bound T >= 4 arms by up to 3x and
# the memory-bound read arm far less. So nvidia-smi samples the clock every 50 ms
# throughout; the arms run in three alternating rounds (no Fusion, Fusion, PyTorch), and once
# more with ten passes per sync (the GPU busy without gaps). `ROUNDS="1 2"` runs two rounds
# (what produced benches/results/h200/pertile/). The q8 kernel tests run first on
# the vulkan backend. Binaries: `gemv-vulkan-nofusion.xz`, `gemv-vulkan.xz`,
# `q8_wgpu-vulkan.xz`. One archive under $OUT.
#
#   bash benches/scripts/h200_pertile.sh
set -u
LOG_NAME=h200-pertile.log
. "$(dirname "$0")/h200_env.sh"

store=/tmp/bm-gemv
sample_clock
run "q8 tests, vulkan (SPIR-V)" "$work/q8_wgpu-vulkan" --test-threads=1
run "gpu warm-up (discarded)" "$work/gemv-vulkan-nofusion" --device vulkan --store "$store" --arms q8,read --t-sweep 1 --passes 300 --json /dev/null
for round in ${ROUNDS:-1 2 3}; do
  for bin in gemv-vulkan-nofusion gemv-vulkan; do
    run "$bin, round $round" "$work/$bin" --device vulkan --store "$store" \
      --arms sync,read,q8,readgraph,q8graph --t-sweep 1,2,4,8 --passes 40 --device-time \
      --json "$out/$bin-r$round.json"
  done
  run "pytorch, round $round" python3 benches/python/gemv_torch.py --arms readf32,fp16,int8pack \
    --t-sweep 1,2,4,8 --passes 40 --json "$out/torch-r$round.json"
done
run "ten passes per sync" "$work/gemv-vulkan-nofusion" --device vulkan --store "$store" --arms read,q8 \
  --t-sweep 1,2,4,8 --passes 40 --per-sync 10 --device-time --json "$out/persync10.json"
stop_clock
(cd "$out" && tar czf pertile.tgz ./*.json smi.csv "$(basename "$log")" && rm -f ./*.json smi.csv)
