#!/usr/bin/env bash
# Issue 4 on the H200: where a protocol pass goes, on the device's own clock.
#
# Last session's per-sync fit left the loss per kernel: 12 read kernels take ~0.74 ms when one
# pass is all a sync waits for and ~0.39 ms per pass with ten passes queued. Two explanations
# predict different device times: if the host encodes the pass's launches before submitting
# them (CubeCL's scheduler gathers up to `tasks_max` launches, Fusion defers its operations to
# the sync), the GPU is idle while it does, and the device's clock over a pass stays near the
# steady-state kernel time; if the kernels themselves run slower (barriers between
# dispatches, clocks), the device time grows with the wall time. So every arm runs with
# `--device-time` (Burn's profiling window, Vulkan timestamp queries) beside its wall time, with
# and without Burn's Fusion (two binaries: `gemv-vulkan.xz` built `--features vulkan,fusion`,
# `gemv-vulkan-nofusion.xz` `--features vulkan`), at tasks_max 32 (default) and 4, in two
# alternating rounds; then ten passes per sync, PyTorch (wall and CUDA-event time) in the same
# call, and the kernel's launch shapes swept again on the device's clock (the earlier sweeps
# ranked them by wall time at one pass per sync, which the run-to-run noise swamped).
# Everything goes into one archive under $OUT.
#
#   bash benches/scripts/h200_fusion.sh
set -u
LOG_NAME=h200-fusion.log
. "$(dirname "$0")/h200_env.sh"

store=/tmp/bm-gemv
run "gpu warm-up (discarded)" "$work/gemv-vulkan" --device vulkan --store "$store" --arms q8,read --t-sweep 1 --passes 300 --json /dev/null
for round in 1 2; do
  for bin in gemv-vulkan gemv-vulkan-nofusion; do
    for tasks in 32 4; do
      CUBECL_WGPU_MAX_TASKS=$tasks run "$bin, tasks_max $tasks, round $round" \
        "$work/$bin" --device vulkan --store "$store" --arms sync,read,q8 --t-sweep 1,8 \
        --passes 60 --device-time --json "$out/$bin-tasks$tasks-r$round.json"
    done
  done
  run "pytorch, round $round" python3 benches/python/gemv_torch.py --arms readf32,fp16,int8pack \
    --t-sweep 1,8 --passes 60 --json "$out/torch-r$round.json"
done
for bin in gemv-vulkan gemv-vulkan-nofusion; do
  run "$bin, ten passes per sync" "$work/$bin" --device vulkan --store "$store" --arms read,q8 \
    --t-sweep 1 --passes 60 --per-sync 1,10 --device-time --json "$out/$bin-persync.json"
done
TUNINGS="${TUNINGS:-32.4.4.2.2,32.8.4.2.2,32.8.4.4.4,32.8.2.2.8,64.4.2.2.2,32.4.8.2.2,32.4.4.4.4,64.2.4.2.2,16.8.4.2.2}"
run "launch shapes, device time" "$work/gemv-vulkan-nofusion" --device vulkan --store "$store" \
  --arms read,q8 --t-sweep 1,8 --passes 40 --tunings "$TUNINGS" --device-time --json "$out/tunings.json"
(cd "$out" && tar czf fusion.tgz ./*.json "$(basename "$log")" && rm -f ./*.json)
