#!/usr/bin/env bash
# Issue 4 on the H200: are the q8 kernel's T = 4 and 8 times a property of the launch shape?
#
# The per-T sweep (h200_tsweep.sh) gave some shapes' T = 4 and 8 times that differed up to 3x
# between its two rounds, and passes within one arm that ranged 1.8-8 ms. This repeats shapes
# inside one process and across two processes, with the device's per-pass min/max, while
# nvidia-smi samples the SM and memory clocks, power, utilization and throttle reasons every
# 50 ms (and lists the GPU's other processes once, at the start). Binary:
# `gemv-vulkan-nofusion.xz`. One archive under $OUT.
#
#   bash benches/scripts/h200_tdiag.sh
set -u
LOG_NAME=h200-tdiag.log
. "$(dirname "$0")/h200_env.sh"

store=/tmp/bm-gemv
bin="$work/gemv-vulkan-nofusion"
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv >> "$log" 2>&1
sample_clock timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu,clocks_throttle_reasons.active
TUNINGS="${TUNINGS:-default,default,32.4.12.4.4.1,32.4.12.4.4.1,64.2.8.4.4.1,64.2.8.4.4.1,32.4.8.1.4.1,32.2.12.4.4.1,32.4.12.2.4.1,64.2.12.2.4.1,32.4.8.2.4.4,32.4.8.2.4.4}"
run "gpu warm-up (discarded)" "$bin" --device vulkan --store "$store" --arms q8,read --t-sweep 1 --passes 300 --json /dev/null
for round in 1 2; do
  run "repeats, process $round" "$bin" --device vulkan --store "$store" --arms read,q8 \
    --t-sweep 1,2,4,8 --passes 40 --tunings "$TUNINGS" --device-time --json "$out/tdiag-r$round.json"
done
stop_clock
nvidia-smi -q -d PERFORMANCE,CLOCK,POWER >> "$log" 2>&1
(cd "$out" && tar czf tdiag.tgz ./*.json smi.csv "$(basename "$log")" && rm -f ./*.json smi.csv)
