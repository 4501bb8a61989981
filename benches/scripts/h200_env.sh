# Sourced by the H200 scripts (h200_shared.sh, h200_qwen.sh). The GPU host needs no Rust
# toolchain: the binaries are built elsewhere and brought in a folder.
#
#   BIN   folder of prebuilt binaries, plain or xz-compressed (NAME or NAME.xz); default ./h200-bin.
#         They are unpacked into WORK (default /tmp/bm-bin) and run from there.
#   OUT   output folder (default ./h200-out); each script writes its log and one archive there.
#
# A `.gl/` folder of Debian packages, when present, is unpacked first, for hosts without a Vulkan
# loader: libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 (with libvulkan1 alone
# the H200 host found no Vulkan adapter). VK_DRIVER_FILES is pointed at the NVIDIA ICD.
out="${OUT:-$PWD/h200-out}"
bin="${BIN:-$PWD/h200-bin}"
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
