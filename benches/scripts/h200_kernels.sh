#!/usr/bin/env bash
# The GPU host's kernels and endpoints, on an H200 or H100 (any Vulkan GPU for the GEMV part),
# from the repository's root. PARTS picks what runs (default "gemv probe"):
#
# gemv   The q8 GEMV table of docs/PERFORMANCE.md: 12 products of 12288 x 7168 int8 weights
#        per pass + one sync, through Burn's `vulkan` backend (SPIR-V) with Fusion. Arms: the
#        read kernel, the dp4a product with its activation split made per product (`q8`) and
#        once per pass for all 12 (`q8shared`, `burn_mapped::q8::Q8Input`: 13 launches instead
#        of 24), each eager and replayed from Burn's graph capture (`*graph`), on the device
#        clock (`--device-time`) and the wall clock; CubeCL's tasks_max (`CUBECL_WGPU_MAX_TASKS`,
#        launches per submission) set to each of TASKS; the FMA kernel replayed at tasks_max 8
#        beside them; PyTorch's fp16 and int8pack arms in the same call. First the q8 kernel
#        tests on the vulkan backend. nvidia-smi samples the SM clock. Results:
#        benches/results/h200/tsweep8/, from
#          PARTS=gemv TASKS=32 ROUNDS="1 2" TSWEEP=1,2,3,4,5,6,7,8 bash benches/scripts/h200_kernels.sh
#        (defaults: ROUNDS="1 2", TASKS="32 8 4", TSWEEP=1,2,4,8; SKIP_TESTS=1 skips the tests).
# probe  The CUDA placement probe of docs/PERFORMANCE.md: machine facts (driver, GPU, PCIe link,
#        glibc, Vulkan ICDs); a synthetic 4 GiB store (64 x 64 MiB pseudo-random files) and a
#        Qwen-shaped one (the 291 tensor file sizes of the real Qwen2.5-Coder-0.5B f32 store,
#        benches/data/qwen_sizes.txt); the CUDA probe (map = READ_ONLY registration + in-place
#        kernel, resident, per-use copy) and the Vulkan import probe on both, JSON + log per
#        store; the synthetic store again with a 16 MiB staging chunk. Results:
#        tools/results/h200/.
#
# The binaries, built on any x86-64 Linux host, go in BIN (default ./h200-bin), plain or xz:
#
#   cargo build --release -p burn-mapped-benches --bin gemv --features vulkan,fusion          # -> gemv-vulkan
#   cargo test --release -p burn-mapped --features vulkan,fusion,gpu-tests --test q8_wgpu --no-run   # -> q8_wgpu-vulkan
#   cargo test --release -p burn-mapped --features vulkan,fusion,gpu-tests --lib --no-run            # -> burn_mapped_lib-vulkan
#   cargo build --release -p burn-mapped-tools --bin cuda_probe --features cuda-probe         # -> cuda_probe
#
# OUT (default ./h200-out) receives the logs and results; WORK (default /tmp/bm-bin) the
# unpacked binaries. A `.gl/` folder of Debian packages, when present, is unpacked first, for
# hosts without a Vulkan loader: libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0
# libgles2 (with libvulkan1 alone the H200 host found no Vulkan adapter).
set -u
out="${OUT:-$PWD/h200-out}"
bin="${BIN:-$PWD/h200-bin}"
mkdir -p "$out"
log="$out/h200-kernels.log"
: > "$log"
if [ -d .gl ]; then
  for f in .gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
for icd in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json /usr/share/vulkan/icd.d/nvidia_icd.json; do
  if [ -f "$icd" ]; then export VK_DRIVER_FILES="$icd"; break; fi
done
export BURN_MAPPED_REQUIRE_GPU=1 RUST_BACKTRACE=1
work="${WORK:-/tmp/bm-bin}"
mkdir -p "$work"
for f in "$bin"/*; do
  [ -f "$f" ] || continue
  case "$f" in
    *.xz) xz -dc "$f" > "$work/$(basename "$f" .xz)" ;;
    *) cp "$f" "$work/" ;;
  esac
  chmod +x "$work/$(basename "$f" .xz)"
done
section() { echo; echo "==== $* ($(date -u +%T))"; } >> "$log"
run() { local name="$1"; shift; section "$name: $*"; "$@" >> "$log" 2>&1; echo "exit $?" >> "$log"; }
# Samples the GPU every 50 ms into $out/smi.csv (fields: $1, default the SM clock, power and
# utilization) until `stop_clock`, or until the script exits, whatever ends it.
sample_clock() {
  nvidia-smi --query-gpu="${1:-timestamp,clocks.sm,power.draw,utilization.gpu}" --format=csv -lms 50 \
    > "$out/smi.csv" 2>&1 &
  smi=$!
  trap 'kill $smi 2>/dev/null' EXIT
}
stop_clock() { kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null; }

parts="${PARTS:-gemv probe}"

if [[ " $parts " == *" gemv "* ]]; then
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
fi

if [[ " $parts " == *" probe "* ]]; then
probe="$work/cuda_probe"
work="$work/probe"
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
"$probe" make-store "$work/qwen-shaped" --sizes benches/data/qwen_sizes.txt 2> "$out/make-qwen-shaped.log"

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
fi
