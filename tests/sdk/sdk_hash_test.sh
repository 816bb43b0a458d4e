#!/usr/bin/env bash
# The plugin SDK changes only with a decision: scripts/sdk_hash.py passes on this tree (the SDK is
# the one engine/sdk_api.lock records), and on a copy of it the check ignores a comment, fails on a
# declaration added without an API-version bump, fails on a bump that was not recorded, and passes
# once the new SDK is recorded.
set -euo pipefail
root=$1
python=${2:-python3}
"$python" "$root/scripts/sdk_hash.py" "$root"

copy=$(mktemp -d)
trap 'rm -rf "$copy"' EXIT
mkdir -p "$copy/engine/include" "$copy/cmake" "$copy/proto" "$copy/scripts"
cp -r "$root/engine/include/engine" "$copy/engine/include/"
cp "$root/engine/sdk_api.lock" "$copy/engine/"
cp "$root/cmake/version.h.in" "$copy/cmake/"
cp -r "$root/proto/engine" "$copy/proto/"
cp "$root/scripts/sdk_hash.py" "$copy/scripts/"
check() { "$python" "$copy/scripts/sdk_hash.py" "$copy" 2>&1; }
fail() { echo "FAIL: $*" >&2; exit 1; }

echo "// a comment changes nothing a plugin compiles" >> "$copy/engine/include/engine/status.h"
sed -i 's|^  optional uint32 bucket_mib|  // another comment\n  optional uint32 bucket_mib|' \
  "$copy/proto/engine/pipeline.proto"
check > /dev/null || fail "a comment counted as a change"

echo "namespace engine { int SomethingNew(); }" >> "$copy/engine/include/engine/status.h"
out=$(check) && fail "a new declaration passed without a bump"
grep -q "ENGINE_PLUGIN_API_VERSION stayed" <<< "$out" || fail "unexpected message: $out"

version=$(sed -n 's/^#define ENGINE_PLUGIN_API_VERSION \([0-9]*\)/\1/p' \
  "$copy/engine/include/engine/plugin_abi.h")
sed -i "s/^#define ENGINE_PLUGIN_API_VERSION .*/#define ENGINE_PLUGIN_API_VERSION $((version + 1))/" \
  "$copy/engine/include/engine/plugin_abi.h"
out=$(check) && fail "a bump passed without being recorded"
grep -q "records the SDK of API $version" <<< "$out" || fail "unexpected message: $out"

"$python" "$copy/scripts/sdk_hash.py" --record "$copy" > /dev/null
check > /dev/null || fail "the recorded SDK did not pass"
echo "the SDK check passes unchanged SDKs and comments, and refuses unrecorded changes"
