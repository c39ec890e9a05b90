#!/usr/bin/env bash
# Installs the Debian packages kiln needs to build and test, only those that are missing.
# Idempotent; the only network it uses is apt's.
# libonnx-dev: only its onnx.proto is used (the ONNX reader compiles it with protoc).
set -euo pipefail
packages=(build-essential cmake pkg-config git clang-format libgtest-dev libbenchmark-dev
          libsentencepiece-dev nlohmann-json3-dev libfmt-dev libcli11-dev libdnnl-dev
          libprotobuf-dev protobuf-compiler libgrpc++-dev protobuf-compiler-grpc
          libcpp-httplib-dev libonnx-dev curl)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# The CLI tests check JSON output with Python's standard library; any python3 on PATH will do.
command -v python3 >/dev/null || missing+=(python3)
# The server tests' clients are npm packages (tests/server/package-lock.json), run by Node.js.
command -v npm >/dev/null || missing+=(nodejs npm)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "kiln: installing missing packages: ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get install -y --no-install-recommends "${missing[@]}" \
  || { $SUDO apt-get update && $SUDO apt-get install -y --no-install-recommends "${missing[@]}"; }
