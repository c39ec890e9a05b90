#!/bin/bash
# Packs what the GPU machine needs to run kiln's CUDA tests and benchmarks from a build made
# here (binaries, the non-system shared libraries they link, the fixture models and these
# scripts) into DEST (default: the main checkout's git-ignored .device/cuda/, the folder the
# device tool carries). Usage: scripts/device/pack.sh [BUILD_DIR] [DEST]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build-cuda}
DEST=${2:-/work/main/.device/cuda}
FIXTURES=$(cd "$ROOT/../shared/fixtures" && pwd)
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/bin" "$STAGE/lib" "$STAGE/fixtures"
cp "$BUILD/kiln" "$BUILD/tests/kiln_tests" "$STAGE/bin/"
# Symbols are not needed there (the device tool carries 64 MiB with the working tree).
strip --strip-unneeded "$STAGE/bin/kiln" "$STAGE/bin/kiln_tests" 2>/dev/null || true
# Shared libraries that are neither glibc/libstdc++ nor CUDA's own (the GPU machine has those).
for lib in $(ldd "$BUILD/kiln" "$BUILD/tests/kiln_tests" | awk '/=> \//{print $3}' | sort -u); do
  case "$(basename "$lib")" in
    libc.so* | libm.so* | libstdc++* | libgcc_s* | libpthread* | libdl.so* | librt.so* | libcublas*) ;;
    *) cp -L "$lib" "$STAGE/lib/" ;;
  esac
done
# Profiling tools' libraries the GPU machine lacks (Nsight Systems' importer needs libdw), kept
# apart from lib/ so that kiln itself never loads them.
mkdir -p "$STAGE/toollib"
for lib in libdw.so.1 libelf.so.1; do
  [ -e "/usr/lib/x86_64-linux-gnu/$lib" ] && cp -L "/usr/lib/x86_64-linux-gnu/$lib" "$STAGE/toollib/"
done
# The fixture models' own files travel in the working tree (models/); only what the repo copy
# lacks (HF's reference outputs) goes in the bundle, and cuda_tests.sh joins the two.
for model in t5-tiny bloom-tiny; do
  mkdir -p "$STAGE/fixtures/$model"
  for f in "$FIXTURES/$model"/*; do
    cmp -s "$f" "$ROOT/models/$model/$(basename "$f")" || cp "$f" "$STAGE/fixtures/$model/"
  done
done
cp -r "$FIXTURES/data" "$STAGE/fixtures/"
mkdir -p "$DEST"
XZ_OPT=-9 tar -C "$STAGE" -cJf "$DEST/bundle.tar.xz" .
cp "$ROOT/scripts/device/"*.sh "$DEST/"
[ -d "$ROOT/bench/gpu" ] && cp "$ROOT/bench/gpu/"* "$DEST/" 2>/dev/null || true
[ -d "$ROOT/bench/serve" ] && cp "$ROOT/bench/serve/"* "$DEST/" 2>/dev/null || true
du -sh "$DEST"
