#!/usr/bin/env bash
# Issue 4 (and 5, 7) on the H200 machine, which has no cargo: runs binaries built on the x86-64
# build machine and carried in a folder, xz-compressed (`BIN`, default .devwork/bin):
#
#   q8_wgpu-wgpu.xz    burn-mapped's q8 kernel tests, Burn `wgpu` backend (WGSL)
#   q8_wgpu-vulkan.xz  the same tests, Burn `vulkan` backend (SPIR-V)
#   gemv-wgpu.xz       benches/src/bin/gemv.rs, --features wgpu,fusion
#   gemv-vulkan.xz     benches/src/bin/gemv.rs, --features vulkan,fusion
#   cuda_probe.xz      tools' CUDA/Vulkan endpoint probe (--features cuda-probe)
#   fallback.xz        gpu-adopt/tests/fallback.rs (host-pointer import refused -> resident)
#   probe.xz           gpu-adopt/examples/probe.rs (is the map arm available; each tensor's placement)
#
# Any that is absent is skipped. The Khronos Vulkan loader and glvnd come as Debian packages in
# .gl/ (see the device notes); PyTorch is the machine's own. Results go to $OUT.
#
#   bash benches/scripts/h200_q8.sh
set -u
LOG_NAME=h200.log
. "$(dirname "$0")/h200_env.sh"

section machine
{ nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current,memory.total --format=csv
  nproc; grep -m1 "model name" /proc/cpuinfo; python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'
} >> "$log" 2>&1

[ -x "$work/q8_wgpu-wgpu" ] && run "q8 tests, wgpu (WGSL)" "$work/q8_wgpu-wgpu" --test-threads=1 --nocapture
[ -x "$work/q8_wgpu-vulkan" ] && run "q8 tests, vulkan (SPIR-V)" "$work/q8_wgpu-vulkan" --test-threads=1 --nocapture

gemv_store=/tmp/bm-gemv
if [ -x "$work/gemv-vulkan" ]; then
  # A freshly started GPU runs its first seconds of work slowly (measured: the first arm of a
  # process after start-up at half speed), so one discarded run first; then two full runs.
  run "gpu warm-up (discarded)" "$work/gemv-vulkan" --device vulkan --store "$gemv_store" --arms q8,read --t-sweep 1 --passes 300 --json /dev/null
  for rep in 1 2; do
    run "gemv vulkan, run $rep" "$work/gemv-vulkan" --device vulkan --store "$gemv_store" --json "$out/gemv-vulkan-$rep.json"
  done
  run "gemv vulkan, per-sync diagnostics" "$work/gemv-vulkan" --device vulkan --store "$gemv_store" --arms sync,read,q8 --t-sweep 1,8 --per-sync 1,10 --json "$out/gemv-vulkan-diag.json"
fi
[ -x "$work/gemv-wgpu" ] && run "gemv wgpu" "$work/gemv-wgpu" --device wgpu --store "$gemv_store" --json "$out/gemv-wgpu.json"
run "gemv pytorch" python3 benches/python/gemv_torch.py --arms read,readf32,fp16,int8pack --json "$out/gemv-torch.json"

if [ -x "$work/cuda_probe" ]; then
  store=/tmp/bm-qwen-shaped
  run "make qwen-shaped store" "$work/cuda_probe" make-store "$store" --sizes tools/scripts/qwen_sizes.txt
  cat "$store"/* > /dev/null
  run "probe qwen-shaped (CUDA + Vulkan import)" "$work/cuda_probe" probe "$store" --passes 5 --warmup 1 --out "$out/probe-qwen-shaped.json"
  rm -rf "$store"
fi
[ -x "$work/fallback" ] && BURN_MAPPED_EXPECT_REFUSAL=1 RUST_LOG=warn run "gpu-adopt fallback" "$work/fallback" --test-threads=1 --nocapture
[ -x "$work/probe" ] && RUST_LOG=warn run "gpu-adopt probe (map arm) on the gemv store" "$work/probe" "$gemv_store"
ls -l "$out" >> "$log"
