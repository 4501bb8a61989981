#!/usr/bin/env bash
# Issue 4 on the H200: products sharing one activation split (`burn_mapped::q8::Q8Input`: the
# dp4a kernel's split made once per pass instead of once per matrix, 13 launches instead of 24)
# against the per-product split, eager and replayed, under CubeCL's tasks_max
# (`CUBECL_WGPU_MAX_TASKS`, launches per submission: a replay submits while it encodes once that
# many are queued, see h200_wall.sh) of `TASKS`; the FMA kernel replayed at tasks_max 8 beside
# them; PyTorch in the same call. First the q8 kernel tests on the vulkan backend (the shared
# split's among them). Device clock throughout; nvidia-smi samples the SM clock.
# Binaries: `gemv-vulkan.xz` (Fusion), `q8_wgpu-vulkan.xz`, `burn_mapped_lib-vulkan.xz`.
# One archive under $OUT.
#
#   bash benches/scripts/h200_shared.sh    (ROUNDS="1 2", TASKS="32 8 4", TSWEEP=1,2,4,8 by default;
#                                           SKIP_TESTS=1 skips the tests)
set -u
LOG_NAME=h200-shared.log
. "$(dirname "$0")/h200_env.sh"

store=/tmp/bm-gemv
sample_clock
if [ -z "${SKIP_TESTS:-}" ]; then
  run "q8 tests, vulkan (SPIR-V)" "$work/q8_wgpu-vulkan" --test-threads=1
  run "q8 lib tests, vulkan" "$work/burn_mapped_lib-vulkan" q8:: --test-threads=1
fi
run "gpu warm-up (discarded)" "$work/gemv-vulkan" --device vulkan --store "$store" --arms q8,read --t-sweep 1 --passes 300 --json /dev/null
for round in ${ROUNDS:-1 2}; do
  for tasks in ${TASKS:-32 8 4}; do
    export CUBECL_WGPU_MAX_TASKS=$tasks
    run "tasks_max $tasks, round $round" "$work/gemv-vulkan" --device vulkan --store "$store" \
      --arms sync,read,q8,q8shared,readgraph,q8graph,q8sharedgraph --t-sweep "${TSWEEP:-1,2,4,8}" \
      --passes 40 --device-time --json "$out/tasks$tasks-r$round.json"
  done
  export CUBECL_WGPU_MAX_TASKS=8
  run "FMA kernel, tasks_max 8, round $round" "$work/gemv-vulkan" --device vulkan --store "$store" \
    --arms q8graph --t-sweep "${TSWEEP:-1,2,4,8}" --passes 40 --device-time \
    --tunings 32.4.4.4.4.4,32.4.8.2.4.2 --json "$out/fma-tasks8-r$round.json"
  unset CUBECL_WGPU_MAX_TASKS
  run "pytorch, round $round" python3 benches/python/gemv_torch.py --arms readf32,fp16,int8pack \
    --t-sweep "${TSWEEP:-1,2,4,8}" --passes 40 --json "$out/torch-r$round.json"
done
stop_clock
(cd "$out" && tar czf shared.tgz ./*.json smi.csv "$(basename "$log")" && rm -f ./*.json smi.csv)
