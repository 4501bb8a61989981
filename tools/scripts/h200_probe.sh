#!/usr/bin/env bash
# The CUDA placement probe of docs/GPU.md, on a GPU host without cargo or network. Put this
# script, `cuda_probe` and `qwen_sizes.txt` in one folder (optionally a Khronos Vulkan loader in
# lib/) and run it from anywhere; it writes everything to $OUT (default ./h200-out). The binary:
#
#   cargo build --release -p burn-mapped-tools --bin cuda_probe --features cuda-probe
#
#   bash h200_probe.sh       (results: tools/results/h200/)
#
# 1. machine facts (driver, GPU, PCIe link, glibc, Vulkan ICDs);
# 2. a synthetic 4 GiB store (64 x 64 MiB pseudo-random files) and a Qwen-shaped store
#    (the 291 tensor file sizes of the real Qwen2.5-Coder-0.5B f32 store, 2.52 GB);
# 3. the CUDA probe (map = READ_ONLY registration + in-place kernel, resident, per-use copy)
#    and the Vulkan import probe on both, JSON + log per store;
# 4. the synthetic store again with a 16 MiB staging chunk.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-$PWD/h200-out}"
mkdir -p "$out"
probe="$here/cuda_probe"
# The Vulkan probe needs the Khronos loader; carry one in lib/ for machines that only have the
# NVIDIA ICD (the driver itself is found through /usr/share/vulkan/icd.d).
if ! ldconfig -p 2>/dev/null | grep -q "libvulkan.so.1 " && [ -d "$here/lib" ]; then
  export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
work="${WORK:-/tmp/burn-mapped-h200}"
rm -rf "$work"
mkdir -p "$work"

{
  echo "== date"; date -u
  echo "== uname"; uname -a
  echo "== glibc"; ldd --version 2>&1 | head -1
  echo "== cpu"; nproc; grep -m1 "model name" /proc/cpuinfo
  echo "== memory"; grep -E "MemTotal|MemAvailable" /proc/meminfo
  echo "== nvidia-smi"; nvidia-smi 2>&1 | head -20
  echo "== pcie link"; nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current,memory.total --format=csv 2>&1
  echo "== libcuda"; ldconfig -p 2>/dev/null | grep -E "libcuda\.so|libvulkan\.so" || true
  echo "== vulkan icds"; ls /usr/share/vulkan/icd.d /etc/vulkan/icd.d 2>&1 || true
  echo "== binary"; ls -l "$probe"; "$probe" --version
} > "$out/machine.txt" 2>&1

"$probe" make-store "$work/synthetic-4g" --bytes 4GiB --files 64 2> "$out/make-synthetic.log"
"$probe" make-store "$work/qwen-shaped" --sizes "$here/qwen_sizes.txt" 2> "$out/make-qwen-shaped.log"

for store in synthetic-4g qwen-shaped; do
  # Read the files once so the mapping starts in the page cache, as a deployed store would be.
  cat "$work/$store"/* > /dev/null
  "$probe" probe "$work/$store" --passes 5 --warmup 1 --out "$out/$store.json" \
    2> "$out/$store.log"
  echo "$store: exit $?" >> "$out/exit-codes.txt"
done

# The same synthetic store with a smaller staging chunk: does per-use copy depend on it?
"$probe" probe "$work/synthetic-4g" --passes 5 --warmup 1 --chunk 16MiB --no-vulkan \
  --out "$out/synthetic-4g-chunk16m.json" 2> "$out/synthetic-4g-chunk16m.log"
echo "synthetic-4g-chunk16m: exit $?" >> "$out/exit-codes.txt"

rm -rf "$work"
# Few files come back from the device: keep the JSON and one combined log.
cat "$out"/machine.txt "$out"/make-*.log "$out"/*.log "$out"/exit-codes.txt > "$out/all.log" 2>/dev/null
rm -f "$out"/make-*.log "$out"/synthetic-4g.log "$out"/qwen-shaped.log \
  "$out"/synthetic-4g-chunk16m.log "$out"/exit-codes.txt
ls -l "$out"
