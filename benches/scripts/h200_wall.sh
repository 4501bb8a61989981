#!/usr/bin/env bash
# Issue 4 on the H200: where a replayed protocol pass spends its wall time beyond the device's
# clock (~0.19-0.27 ms per pass in the eleventh session, for the read kernel too). Per round:
# the replayed arms (`readgraph`, `q8graph` at T = 1, 2, 4, 8) under CubeCL's tasks_max
# (`CUBECL_WGPU_MAX_TASKS`: how many launches it gathers per submission; a replay submits
# while it encodes once that many are queued, so the GPU can start before the sync) of `TASKS`,
# then once more at the default with `--flush-first` (enqueue, submission and the wait timed
# apart); PyTorch in the same call. Then what the dp4a kernel's activation split costs: the
# same passes over 12 matrices of only 16 rows, where the product is tiny, with the dp4a default
# (split + product per matrix) against the FMA kernel (no split). Device clock throughout;
# nvidia-smi samples the SM clock.
# Binary: `gemv-vulkan.xz` (Fusion). One archive under $OUT.
#
#   bash benches/scripts/h200_wall.sh      (ROUNDS="1 2", TASKS="32 8 4 2 1" by default)
set -u
LOG_NAME=h200-wall.log
. "$(dirname "$0")/h200_env.sh"

store=/tmp/bm-gemv
sample_clock
run "gpu warm-up (discarded)" "$work/gemv-vulkan" --device vulkan --store "$store" --arms q8,read --t-sweep 1 --passes 300 --json /dev/null
for round in ${ROUNDS:-1 2}; do
  for tasks in ${TASKS:-32 8 4 2 1}; do
    export CUBECL_WGPU_MAX_TASKS=$tasks
    run "tasks_max $tasks, round $round" "$work/gemv-vulkan" --device vulkan --store "$store" \
      --arms sync,readgraph,q8graph --t-sweep 1,2,4,8 --passes 40 --device-time \
      --json "$out/tasks$tasks-r$round.json"
  done
  unset CUBECL_WGPU_MAX_TASKS
  run "flush first, round $round" "$work/gemv-vulkan" --device vulkan --store "$store" \
    --arms sync,readgraph,q8graph --t-sweep 1,2,4,8 --passes 40 --flush-first \
    --json "$out/flush-r$round.json"
  run "pytorch, round $round" python3 benches/python/gemv_torch.py --arms readf32,fp16,int8pack \
    --t-sweep 1,2,4,8 --passes 40 --json "$out/torch-r$round.json"
done
for round in ${ROUNDS:-1 2}; do
  run "16-row matrices, round $round" "$work/gemv-vulkan" --device vulkan --store /tmp/bm-gemv-16 \
    --out 16 --arms readgraph,q8graph --t-sweep 1,2,8 --passes 40 --device-time \
    --tunings default,32.4.4.4.4.4 --json "$out/rows16-r$round.json"
done
stop_clock
(cd "$out" && tar czf wall.tgz ./*.json smi.csv "$(basename "$log")" && rm -f ./*.json smi.csv)
