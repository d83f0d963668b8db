#!/usr/bin/env bash
# Build the Lambda deployment zip: agentkernel[aws] built for the Lambda platform, plus the entry
# files and agents in lambda/. Usage: ./build_package.sh [x86_64|arm64] (default x86_64).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
arch="${1:-x86_64}"
case "$arch" in
  x86_64) platform=manylinux2014_x86_64 ;;
  arm64) platform=manylinux2014_aarch64 ;;
  *) echo "architecture must be x86_64 or arm64" >&2; exit 2 ;;
esac
build="$here/build"
rm -rf "$build/package" "$build/wheels" && mkdir -p "$build/package" "$build/wheels"
python3 -m pip wheel --quiet --no-deps --wheel-dir "$build/wheels" "$root"
wheel="$(ls "$build/wheels"/agentkernel-*.whl)"
python3 -m pip install --quiet --target "$build/package" --platform "$platform" \
  --implementation cp --python-version 3.12 --only-binary=:all: --no-warn-conflicts \
  "${wheel}[aws]"
cp "$here"/lambda/*.py "$build/package/"
rm -f "$build/agentkernel-lambda.zip"
(cd "$build/package" && python3 -m zipfile -c ../agentkernel-lambda.zip *)
echo "$build/agentkernel-lambda.zip"
