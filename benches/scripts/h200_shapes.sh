#!/usr/bin/env bash
# Issue 4 on the H200: dp4a launch shapes for T = 4 and 8 around the defaults (`FEW`
# dot.64.4.2.2, `MANY` dot.32.4.8.1), each replayed with one shared activation split per pass
# (`--arms q8sharedgraph`: the product kernel alone is what the shape changes), device clock,
# two rounds (shapes ranked over both). Binary: `gemv-vulkan.xz`. One archive under $OUT.
#
#   bash benches/scripts/h200_shapes.sh   (ROUNDS="1 2"; SHAPES= a comma-separated list)
set -u
LOG_NAME=h200-shapes.log
. "$(dirname "$0")/h200_env.sh"

store=/tmp/bm-gemv
SHAPES="${SHAPES:-dot.64.4.2.2,dot.32.4.8.1,dot.64.2.4.2,dot.32.4.4.2,dot.64.4.4.1,dot.32.8.2.2,dot.128.2.2.2,dot.64.2.2.4,dot.32.4.8.2,dot.64.2.8.1,dot.32.8.8.1,dot.64.4.4.2,dot.32.4.6.1,dot.32.4.12.1,dot.32.2.16.1,dot.64.2.6.1}"
sample_clock
run "gpu warm-up (discarded)" "$work/gemv-vulkan" --device vulkan --store "$store" --arms q8,read --t-sweep 1 --passes 300 --json /dev/null
for round in ${ROUNDS:-1 2}; do
  run "shapes, round $round" "$work/gemv-vulkan" --device vulkan --store "$store" \
    --arms q8sharedgraph --t-sweep 4,8 --passes 40 --device-time --tunings "$SHAPES" \
    --json "$out/shapes-r$round.json"
done
stop_clock
(cd "$out" && tar czf shapes.tgz ./*.json smi.csv "$(basename "$log")" && rm -f ./*.json smi.csv)
