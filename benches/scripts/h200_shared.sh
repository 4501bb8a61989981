#!/usr/bin/env bash
# The q8 GEMV table of docs/GPU.md on an H200 (or any Vulkan GPU): 12 products of 12288 x 7168
# int8 weights per pass + one sync, through Burn's `vulkan` backend (SPIR-V) with Fusion. Arms:
# the read kernel, the dp4a product with its activation split made per product (`q8`) and once
# per pass for all 12 (`q8shared`, `burn_mapped::q8::Q8Input`: 13 launches instead of 24), each
# eager and replayed from Burn's graph capture (`*graph`), on the device clock (`--device-time`)
# and the wall clock; CubeCL's tasks_max (`CUBECL_WGPU_MAX_TASKS`, launches per submission) set
# to each of TASKS; the FMA kernel replayed at tasks_max 8 beside them; PyTorch's fp16 and int8pack
# arms in the same call. First the q8 kernel tests on the vulkan backend. nvidia-smi samples the
# SM clock. See h200_env.sh for BIN, OUT and WORK. The binaries, built on any x86-64 Linux host:
#
#   cargo build --release -p burn-mapped-benches --bin gemv --features vulkan,fusion          # -> gemv-vulkan
#   cargo test --release -p burn-mapped --features vulkan,fusion --test q8_wgpu --no-run   # -> q8_wgpu-vulkan
#   cargo test --release -p burn-mapped --features vulkan,fusion --lib --no-run            # -> burn_mapped_lib-vulkan
#
# The table in docs/GPU.md came from
#
#   TASKS=32 ROUNDS="1 2" TSWEEP=1,2,3,4,5,6,7,8 bash benches/scripts/h200_shared.sh
#
# (defaults: ROUNDS="1 2", TASKS="32 8 4", TSWEEP=1,2,4,8; SKIP_TESTS=1 skips the tests).
# Results: benches/results/h200/tsweep8/.
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
