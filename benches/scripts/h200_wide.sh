#!/usr/bin/env bash
# Issue 4 on the H200: the launch shape for T = 5..8, weighing the device's time per pass against
# the first launch's shader compile (each arm's `span_unix_s` includes it: ~8 s for 32.4.12.2.4.4
# at T = 8 in h200_pertile.sh, ~1 s for the narrower shapes). The warm-up now times its 200 ms
# from the end of the compiling pass, so the clock is back up when timing starts; nvidia-smi
# samples it. Two processes. Binary: `gemv-vulkan-nofusion.xz`. One archive under $OUT.
#
#   bash benches/scripts/h200_wide.sh
set -u
LOG_NAME=h200-wide.log
. "$(dirname "$0")/h200_env.sh"

store=/tmp/bm-gemv
sample_clock
TUNINGS="${TUNINGS:-32.4.8.2.4.1,32.4.8.1.4.1,32.4.12.2.4.4,32.4.12.4.4.1,32.4.8.4.4.1,64.2.8.2.4.1,32.4.8.2.4.2,64.2.8.4.4.1}"
run "gpu warm-up (discarded)" "$work/gemv-vulkan-nofusion" --device vulkan --store "$store" --arms read --passes 300 --json /dev/null
for round in 1 2; do
  run "T = 4, 8 shapes, process $round" "$work/gemv-vulkan-nofusion" --device vulkan --store "$store" \
    --arms q8 --t-sweep 4,8 --passes 40 --tunings "$TUNINGS" --device-time --json "$out/wide-r$round.json"
done
stop_clock
(cd "$out" && tar czf wide.tgz ./*.json smi.csv "$(basename "$log")" && rm -f ./*.json smi.csv)
