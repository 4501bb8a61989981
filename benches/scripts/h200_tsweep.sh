#!/usr/bin/env bash
# Issue 4 on the H200: launch shapes per activation count T, on the device's clock.
#
# At T = 8 the q8 kernel took 1.48 ms per protocol pass (device clock) against 0.34 at T = 1,
# and the earlier sweeps showed T = 8 falling with more rows per thread (rows 8: 0.94 ms), i.e.
# with fewer activation loads per weight. Those loads were also scattered: a lane's 4-word
# (16-weight) load needs 64 contiguous bytes of each activation row, so a warp's vec4
# activation loads were 64 bytes apart. The new sixth field `vector` (words per weight load)
# makes them contiguous at 1. This sweeps shapes over T = 1, 2, 4, 8 in two rounds, with
# PyTorch's fp16 and int8 arms at the same T, so the per-T defaults
# (`CubeTuning::default_for`) are chosen from the device's clock. Binary:
# `gemv-vulkan-nofusion.xz` (`--features vulkan`). One archive under $OUT.
#
#   bash benches/scripts/h200_tsweep.sh
set -u
LOG_NAME=h200-tsweep.log
. "$(dirname "$0")/h200_env.sh"

store=/tmp/bm-gemv
bin="$work/gemv-vulkan-nofusion"
TUNINGS="${TUNINGS:-default,32.4.8.2.4.4,32.4.4.8.4.4,32.4.4.4.4.1,32.4.4.8.4.1,32.4.4.16.4.1,32.4.2.16.4.1,32.4.8.4.4.1,32.4.8.8.4.1,32.2.8.8.4.1,64.2.8.4.4.1,32.8.8.4.4.1,32.4.4.8.4.2,32.4.8.4.4.2,32.4.12.4.4.1,32.4.16.2.4.1}"
run "gpu warm-up (discarded)" "$bin" --device vulkan --store "$store" --arms q8,read --t-sweep 1 --passes 300 --json /dev/null
for round in 1 2; do
  run "launch shapes, round $round" "$bin" --device vulkan --store "$store" --arms read,q8 \
    --t-sweep 1,2,4,8 --passes 40 --tunings "$TUNINGS" --device-time --json "$out/tsweep-r$round.json"
  run "pytorch, round $round" python3 benches/python/gemv_torch.py --arms readf32,fp16,int8pack \
    --t-sweep 1,2,4,8 --passes 40 --json "$out/torch-r$round.json"
done
(cd "$out" && tar czf tsweep.tgz ./*.json "$(basename "$log")" && rm -f ./*.json)
