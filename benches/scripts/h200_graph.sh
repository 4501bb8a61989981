#!/usr/bin/env bash
# Issue 4 on the H200: the protocol pass with Burn's graph capture.
#
# On the device's clock our kernels beat PyTorch's (h200_fusion.sh); per pass on the wall clock
# they lose the difference to host work per launch (~25-30 us through Burn's dispatch, Fusion and
# CubeCL's launch path; running CubeCL's device server in the calling thread changed nothing,
# h200_inline.sh). Burn 0.22's graph capture (`burn::tensor::capture`) records a pass's launches
# once; a replay re-encodes them from prebuilt pipelines and bind groups. This times the eager
# arms and the replayed ones (`readgraph`, `q8graph`), with and without Fusion, three alternating
# rounds with device times and PyTorch in every round. Binaries: `gemv-vulkan.xz` (`--features
# vulkan,fusion`) and `gemv-vulkan-nofusion.xz` (`--features vulkan`). One archive under $OUT.
#
#   bash benches/scripts/h200_graph.sh
set -u
LOG_NAME=h200-graph.log
. "$(dirname "$0")/h200_env.sh"

store=/tmp/bm-gemv
run "gpu warm-up (discarded)" "$work/gemv-vulkan-nofusion" --device vulkan --store "$store" --arms q8,read --t-sweep 1 --passes 300 --json /dev/null
for round in 1 2 3; do
  for bin in gemv-vulkan-nofusion gemv-vulkan; do
    run "$bin, round $round" "$work/$bin" --device vulkan --store "$store" \
      --arms sync,read,q8,readgraph,q8graph --t-sweep 1,8 --passes 60 --device-time \
      --json "$out/$bin-r$round.json"
  done
  run "pytorch, round $round" python3 benches/python/gemv_torch.py --arms readf32,fp16,int8pack \
    --t-sweep 1,8 --passes 60 --json "$out/torch-r$round.json"
done
run "q8 vs Burn f32 matmul" "$work/gemv-vulkan-nofusion" --device vulkan --store "$store" \
  --arms q8,f32 --float-matrices 1 --t-sweep 1 --passes 10 --json "$out/check.json"
(cd "$out" && tar czf graph.tgz ./*.json "$(basename "$log")" && rm -f ./*.json)
