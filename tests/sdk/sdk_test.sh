#!/usr/bin/env bash
# The SDK as a third party uses it: install the engine, build examples/third_party_plugin against the
# installed package with find_package(Engine), run its conformance tests, then load the plugin, check
# it with `engine conformance` and train with it.
#   sdk_test.sh <source dir> <build dir> [the build's CMAKE_PREFIX_PATH, ':'-separated]
set -euo pipefail
src=$1
build=$2
# Where the engine's own build found Torch and the rest (LibTorch 2.x from pip, carried packages).
deps=${3:-}
work=$(mktemp -d)
trap '[ -n "${KEEP_WORK:-}" ] || rm -rf "$work"' EXIT

cmake --install "$build" --prefix "$work/prefix" >/dev/null
test -x "$work/prefix/bin/engine"
test -f "$work/prefix/include/engine/plugin.h"
test -f "$work/prefix/include/engine/pipeline.pb.h"
libdir=$(dirname "$(find "$work/prefix" -name libengine.so | head -n 1)")
test -f "$libdir/engine/plugins/engine_digits.so"

# Quiet unless it fails; then the whole configure/build log is shown.
quiet() { "$@" >"$work/step.log" 2>&1 || { cat "$work/step.log"; return 1; }; }
quiet cmake -S "$src/examples/third_party_plugin" -B "$work/hello" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix${deps:+;${deps//:/;}}"
quiet cmake --build "$work/hello"
# The GoogleTest form of the conformance suite, linked from the installed SDK.
(cd "$work/hello" && ctest --output-on-failure -j2 >"$work/ctest.log") || { cat "$work/ctest.log"; exit 1; }
grep -q "100% tests passed" "$work/ctest.log"
plugin=$(find "$work/hello" -name engine_hello.so)
test -n "$plugin"

engine=$work/prefix/bin/engine
export ENGINE_PLUGIN_PATH=$(dirname "$plugin")
listing=$("$engine" plugins)
echo "$listing"
grep -q "^hello .*callback .*1.0.0 .*engine_hello.so" <<<"$listing"
grep -q "engine_digits.so" <<<"$listing"   # the installed engine finds its built-in plugins
"$engine" plugins describe hello | grep -q 'greeting: "hello"'
conformance=$("$engine" conformance "$plugin")
echo "$conformance"
grep -q "4 checks: 4 passed, 0 failed, 0 skipped" <<<"$conformance"

cat >"$work/p.pbtxt" <<PIPELINE
output_dir: "out"
stage {
  name: "greeted"
  model { plugin: "mlp" }
  data { plugin: "digits" options { [type.googleapis.com/engine.plugins.DigitsOptions] { path: "$src/data/digits.csv.gz" } } }
  schedule { max_steps: 5 }
  callback { plugin: "hello" options { [type.googleapis.com/hello.HelloOptions] { greeting: "good morning" } } }
}
PIPELINE
out=$("$engine" run "$work/p.pbtxt")
echo "$out"
grep -q "good morning, stage 'greeted'" <<<"$out"
grep -q "stage 'greeted' ended with eval/accuracy" <<<"$out"
test -f "$work/out/greeted/final/manifest.pbtxt"

sed -i 's/good morning//' "$work/p.pbtxt"
if "$engine" check "$work/p.pbtxt" 2>"$work/err"; then
  echo "an empty greeting was accepted" >&2
  exit 1
fi
grep -q "p.pbtxt:7:83: error: stage .greeted. callback 'hello': options.greeting: must not be empty" "$work/err"
echo "SDK OK"
