#!/usr/bin/env bash
# Builds one fuzz target with libFuzzer coverage instrumentation, on stable Rust, and runs it.
#
#   burn-mapped/fuzz/run.sh TARGET [SECONDS] [LIBFUZZER_OPTION...]
#
# TARGET is the name of one of fuzz_targets/*.rs; SECONDS (default 600) becomes
# -max_total_time. The committed corpus/TARGET/ is only read: inputs that reach new coverage
# are written to target/corpus/TARGET/ (kept between runs; delete it to start from the seeds
# alone) and crashing inputs to artifacts/TARGET/. Both are git-ignored. Extra arguments go to
# libFuzzer, e.g. -jobs=4 or -max_len=65536.
#
# The instrumented build lives in target/libfuzzer/, apart from the plain `cargo build` and
# `cargo test` in target/. Coverage instrumentation (the flags cargo-fuzz passes with
# `--sanitizer none`) applies to this crate and its dependencies, that is the parsers under
# test and the crates they call (serde_json, safetensors, burn-pack, ciborium, ...). Naming the
# host triple with --target keeps RUSTFLAGS off build scripts and proc macros, which would not
# link against libFuzzer. Debug assertions and overflow checks are on, so wrapping arithmetic
# panics instead of passing unnoticed.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
usage="usage: $0 TARGET [SECONDS] [LIBFUZZER_OPTION...]"
target=${1:?$usage}
seconds=${2:-600}
shift $(($# >= 2 ? 2 : 1))
if [[ ! -f "$here/fuzz_targets/$target.rs" ]]; then
    targets=$(cd "$here/fuzz_targets" && ls | sed 's/\.rs$//')
    echo "no target '$target'; the targets are:" $targets >&2
    exit 2
fi

host=$(rustc -vV | sed -n 's/^host: //p')
unset CARGO_ENCODED_RUSTFLAGS CARGO_BUILD_RUSTFLAGS
export RUSTFLAGS="-Cpasses=sancov-module \
-Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
-Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares \
--cfg fuzzing -Cdebug-assertions -Coverflow-checks -Cdebuginfo=line-tables-only"
cargo build --release --locked --manifest-path "$here/Cargo.toml" --target "$host" \
    --target-dir "$here/target/libfuzzer" --bin "$target"

scratch=$here/target/corpus/$target
artifacts=$here/artifacts/$target
mkdir -p "$scratch" "$artifacts"
exec "$here/target/libfuzzer/$host/release/$target" "$scratch" "$here/corpus/$target" \
    -max_total_time="$seconds" -timeout=30 -artifact_prefix="$artifacts/" \
    -print_final_stats=1 "$@"
