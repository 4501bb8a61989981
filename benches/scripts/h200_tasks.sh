#!/usr/bin/env bash
# Issue 4 on the H200: does submitting each kernel as it is encoded shorten a protocol pass?
#
# CubeCL's wgpu runtime gathers up to `tasks_max` kernel launches into one command buffer
# before submitting (default 32; `CUBECL_WGPU_MAX_TASKS` sets it). A protocol pass is 12
# launches + one sync, so by default nothing reaches the GPU until the sync: encoding and
# execution add up. With a small `tasks_max` the GPU starts on the first products while the
# host encodes the next. This runs the gemv binary (`gemv-vulkan.xz`, `--features
# vulkan,fusion`) at several settings, alternating in two rounds, plus PyTorch fp16 and its
# read arm in the same call, then a per-sync fit: 1, 2, 4 and 12 matrices per pass at 1, 2, 4
# and 10 passes per sync. Everything goes into one archive under $OUT (the device tool returns
# only a few files per call).
#
#   bash benches/scripts/h200_tasks.sh
set -u
LOG_NAME=h200-tasks.log
. "$(dirname "$0")/h200_env.sh"

store=/tmp/bm-gemv
gemv="$work/gemv-vulkan"
run "gpu warm-up (discarded)" "$gemv" --device vulkan --store "$store" --arms q8,read --t-sweep 1 --passes 300 --json /dev/null
for round in 1 2; do
  for tasks in 32 1 2 4 12; do
    CUBECL_WGPU_MAX_TASKS=$tasks run "gemv vulkan, tasks_max $tasks, round $round" \
      "$gemv" --device vulkan --store "$store" --arms sync,read,q8 --t-sweep 1,2,4,8 --passes 60 \
      --json "$out/gemv-tasks$tasks-r$round.json"
  done
done
run "gemv pytorch" python3 benches/python/gemv_torch.py --arms readf32,fp16 --t-sweep 1,8 --passes 60 --json "$out/gemv-torch.json"
for m in 1 2 4 12; do
  run "matrices $m" "$gemv" --device vulkan --store "$store" --matrices "$m" --float-matrices 0 \
    --arms sync,read,q8 --t-sweep 1 --passes 60 --per-sync 1,2,4,10 --json "$out/fixed-m$m.json"
done
(cd "$out" && tar czf tasks.tgz ./*.json "$(basename "$log")" && rm -f ./*.json)
