#!/usr/bin/env bash
# Issue 4 on the H200 machine: where the q8 GEMV's time goes, and which kernel launch shape to
# ship. Runs the gemv binary built here with `--features vulkan,fusion` (gemv-vulkan.xz in BIN,
# default .devwork/bin; see h200_env.sh) and the PyTorch arms; results go to $OUT.
#
#   1. diag:  sync floor, read and q8 (T=1) with 1 and 10 passes per sync, enqueue times
#   2. sweep: read and q8 (T=1, 8) for each launch shape in TUNINGS
#   3. tasks: CubeCL's submission batch size (CUBECL_WGPU_MAX_TASKS) against the per-pass time
#   4. torch: PyTorch's int32-sum and float32-sum reads and fp16 F.linear on the same shapes
#
#   bash benches/scripts/h200_tune.sh
set -u
LOG_NAME=tune.log
. "$(dirname "$0")/h200_env.sh"
TUNINGS="${TUNINGS:-32.8.4.1.1,32.8.4.2.2,32.8.4.4.4,32.8.2.2.8,32.8.1.4.8,32.8.8.1.1,32.4.4.2.2,64.4.2.2.2,16.16.4.2.2,8.32.4.2.2,32.2.4.2.2,128.2.1.4.4,256.1.1.2.2}"
# (the first session's list; the second narrowed it around the best: see benches/results/h200/)
section machine
nvidia-smi --query-gpu=name,driver_version,clocks.max.memory,memory.total --format=csv >> "$log" 2>&1
[ -n "${SKIP_DIAG:-}" ] || run diag timeout 240 "$work/gemv-vulkan" --device vulkan --arms sync,read,q8 --t-sweep 1 --per-sync 1,10 --json "$out/diag.json"
run sweep timeout 400 "$work/gemv-vulkan" --device vulkan --arms read,q8 --t-sweep 1,8 --tunings "$TUNINGS" --json "$out/sweep.json"
for tm in ${TASKS:-32 1 4 12 64}; do
  export CUBECL_WGPU_MAX_TASKS=$tm
  run "tasks-$tm" timeout 120 "$work/gemv-vulkan" --device vulkan --arms read,q8 --t-sweep 1,8 --per-sync 1,10 --tunings "${TASK_TUNING:-32.4.4.2.2}" --json "$out/tasks-$tm.json"
done
unset CUBECL_WGPU_MAX_TASKS
[ -n "${SKIP_TORCH:-}" ] || run torch timeout 200 python3 benches/python/gemv_torch.py --arms read,readf32,fp16 --t-sweep 1 --json "$out/torch.json"
