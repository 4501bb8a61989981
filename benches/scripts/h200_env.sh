# Sourced by the H200 scripts: the Vulkan loader from the carried Debian packages (.gl/:
# libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2, as the device README lists;
# with libvulkan1 alone the tenth session's machine found no Vulkan adapter), the
# NVIDIA ICD, the output folder and log (`$out`, `$log` named by the caller's LOG_NAME), and
# the carried binaries (BIN, default .devwork/bin, xz-compressed) unpacked into /tmp/bm-bin.
out="${OUT:-$PWD/h200-out}"
bin="${BIN:-$PWD/.devwork/bin}"
mkdir -p "$out"
log="$out/${LOG_NAME:-h200.log}"
: > "$log"
if [ -d .gl ]; then
  for f in .gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
for icd in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json /usr/share/vulkan/icd.d/nvidia_icd.json; do
  if [ -f "$icd" ]; then export VK_DRIVER_FILES="$icd"; break; fi
done
export BURN_MAPPED_REQUIRE_GPU=1 RUST_BACKTRACE=1
work=/tmp/bm-bin
mkdir -p "$work"
for f in "$bin"/*.xz; do
  [ -e "$f" ] || continue
  xz -dc "$f" > "$work/$(basename "$f" .xz)" && chmod +x "$work/$(basename "$f" .xz)"
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
