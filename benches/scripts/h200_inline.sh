#!/usr/bin/env bash
# Issue 4 on the H200: is the per-launch host cost CubeCL's thread hand-off?
#
# CubeCL 0.11 runs each device's server on its own thread and reaches it through a channel, so
# every launch crosses threads; a profile of the host side (perf, lavapipe) put most of the
# non-shader time in that channel's server loop and in the kernel's context switches. CubeCL
# also has an in-thread device handle (a reentrant mutex: the calling thread runs the server),
# which it uses where there are no threads. `benches/patches/cubecl-common-inline-device.patch`
# selects it everywhere (one line). The binary was built here with it applied to a copy of the
# registry crate:
#
#   mkdir -p /tmp/cc && cp -r ~/.cargo/registry/src/index.crates.io-*/cubecl-common-0.11.3 /tmp/cc/
#   patch -p1 -d /tmp/cc < benches/patches/cubecl-common-inline-device.patch
#   cargo build --release -p burn-mapped-benches --bin gemv --features vulkan \
#     --config 'patch.crates-io.cubecl-common.path="/tmp/cc/cubecl-common-0.11.3"'
#   git checkout Cargo.lock   # the patch entry cargo writes there is not to be committed
#
# This runs that binary (`gemv-vulkan-inline.xz`) against the stock one (`gemv-vulkan-nofusion.xz`,
# both `--features vulkan`, no Fusion) in three alternating rounds with device times, PyTorch in
# every round, then a per-sync fit for both. Everything goes into one archive under $OUT.
#
#   bash benches/scripts/h200_inline.sh
set -u
LOG_NAME=h200-inline.log
. "$(dirname "$0")/h200_env.sh"

store=/tmp/bm-gemv
run "gpu warm-up (discarded)" "$work/gemv-vulkan-nofusion" --device vulkan --store "$store" --arms q8,read --t-sweep 1 --passes 300 --json /dev/null
for round in 1 2 3; do
  for bin in gemv-vulkan-nofusion gemv-vulkan-inline; do
    run "$bin, round $round" "$work/$bin" --device vulkan --store "$store" --arms sync,read,q8 \
      --t-sweep 1,8 --passes 60 --device-time --json "$out/$bin-r$round.json"
  done
  run "pytorch, round $round" python3 benches/python/gemv_torch.py --arms readf32,fp16,int8pack \
    --t-sweep 1,8 --passes 60 --json "$out/torch-r$round.json"
done
for bin in gemv-vulkan-nofusion gemv-vulkan-inline; do
  for m in 1 12; do
    run "$bin, $m matrices, 1 and 10 passes per sync" "$work/$bin" --device vulkan --store "$store" \
      --matrices "$m" --float-matrices 0 --arms read,q8 --t-sweep 1 --passes 60 --per-sync 1,10 \
      --device-time --json "$out/$bin-fit-m$m.json"
  done
done
run "inline: q8 vs Burn f32 matmul" "$work/gemv-vulkan-inline" --device vulkan --store "$store" \
  --arms q8,f32 --float-matrices 1 --t-sweep 1 --passes 10 --json "$out/inline-check.json"
(cd "$out" && tar czf inline.tgz ./*.json "$(basename "$log")" && rm -f ./*.json)
