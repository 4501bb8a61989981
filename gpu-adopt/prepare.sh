#!/usr/bin/env bash
# Builds the patched CubeCL crates this workspace's `[patch.crates-io]` points at.
#
# For each crate the patch touches: take the pristine `.crate` archive from cargo's registry
# cache (fetching it first if needed), check its SHA-256 against the checksum in the root
# Cargo.lock, unpack it under gpu-adopt/.patched/, then apply patches/cubecl-external-buffers.patch
# with `patch`. Nothing from CubeCL is committed to this repository; .patched/ is ignored.
#
# Usage: gpu-adopt/prepare.sh   (idempotent, and leaves an up-to-date .patched/ untouched;
# re-run after editing the patch)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
out="$here/.patched"
patch_file="$here/patches/cubecl-external-buffers.patch"
version=0.11.3
crates=(cubecl-runtime cubecl-server cubecl-wgpu)

checksum() { # the Cargo.lock checksum of crate $1 at $version
    awk -v n="$1" -v v="$version" '
        $0 == "name = \"" n "\"" { hit = 1; next }
        hit && $0 == "version = \"" v "\"" { ver = 1; next }
        hit && ver && /^checksum = / { gsub(/checksum = |"/, ""); print; exit }
        /^\[\[package\]\]/ { hit = 0; ver = 0 }' "$root/Cargo.lock"
}

cache_dir() { ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/index.crates.io-*/ 2>/dev/null | head -n1; }

archive() { # path of the cached .crate of $1, fetching the root workspace's sources if absent
    local dir
    dir="$(cache_dir)"
    if [[ -z "$dir" || ! -f "$dir/$1-$version.crate" ]]; then
        (cd "$root" && cargo fetch --locked >/dev/null)
        dir="$(cache_dir)"
    fi
    echo "$dir/$1-$version.crate"
}

rm -rf "$out.tmp"
mkdir -p "$out.tmp"
for crate in "${crates[@]}"; do
    want="$(checksum "$crate")"
    [[ -n "$want" ]] || { echo "prepare: $crate $version is not in $root/Cargo.lock" >&2; exit 1; }
    file="$(archive "$crate")"
    got="$(sha256sum "$file" | cut -d' ' -f1)"
    if [[ "$got" != "$want" ]]; then
        echo "prepare: $file has sha256 $got, Cargo.lock says $want" >&2
        exit 1
    fi
    tar -xzf "$file" -C "$out.tmp"
done
patch -p1 --quiet --forward -d "$out.tmp" < "$patch_file"
# Keep an identical earlier result, and with it its timestamps: cargo decides by modification
# time whether a path dependency changed, and a fresh copy would rebuild Burn above it.
if [[ -d "$out" ]] && diff -rq "$out.tmp" "$out" >/dev/null; then
    rm -rf "$out.tmp"
    echo "prepare: ${crates[*]} $version in $out are up to date"
    exit 0
fi
rm -rf "$out"
mv "$out.tmp" "$out"
echo "prepare: patched ${crates[*]} $version into $out"
