#!/usr/bin/env bash
# Configuring the engine refuses what would build a wrong or unusable engine, naming it: a Python
# environment that is not there, and a LibTorch other than the pinned one (both versions named).
#   configure_refusals_test.sh <source dir> <the build's ENGINE_PYTHON>
set -euo pipefail
src=$1
python=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# expect_refusal NAME TEXT ARGS...: configuring with ARGS fails and prints TEXT.
expect_refusal() {
  local name=$1 text=$2
  shift 2
  if cmake -S "$src" -B "$work/$name" -G Ninja -DENGINE_BUILD_TESTS=OFF \
      -DENGINE_BUILD_BENCHMARKS=OFF "$@" >"$work/$name.log" 2>&1; then
    echo "FAIL $name: configuring succeeded; expected a refusal saying: $text"
    exit 1
  fi
  if ! tr -s ' \n' ' ' <"$work/$name.log" | grep -qF -- "$text"; then
    echo "FAIL $name: the refusal does not say: $text"
    cat "$work/$name.log"
    exit 1
  fi
  echo "ok $name"
}

expect_refusal missing_python "no Python environment at $work/none/bin/python" \
  -DENGINE_PYTHON="$work/none/bin/python"
installed=$("$python" -c 'import torch; print(torch.__version__.split("+")[0])')
expect_refusal other_torch "LibTorch $installed" -DENGINE_PYTHON="$python" \
  -DENGINE_TORCH_PINNED_VERSION=2.99.0
expect_refusal other_torch_pin "is not the pinned torch==2.99.0" -DENGINE_PYTHON="$python" \
  -DENGINE_TORCH_PINNED_VERSION=2.99.0
