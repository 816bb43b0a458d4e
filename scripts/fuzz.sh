#!/usr/bin/env bash
# Builds the libFuzzer targets in fuzz/ with clang and runs them (ctest runs both steps: the
# Fuzz.* tests in tests/CMakeLists.txt):
#
#   scripts/fuzz.sh build                  # configure and build BUILD_DIR/fuzz (default build/fuzz)
#   scripts/fuzz.sh run TARGET [SECONDS]   # replay its regression inputs, then fuzz (default 60 s)
#   scripts/fuzz.sh all [SECONDS]          # build, then run every target
#
# Seeds come from the tests' fixtures (templates, tokenizers, chat lines, images, safetensors,
# pipelines); what libFuzzer finds beyond them stays in BUILD_DIR/fuzz/corpus/TARGET for the next
# run. An input that crashes a target, hangs past 30 s or takes more than 4 GB is saved under
# BUILD_DIR/fuzz/artifacts/TARGET/ and the run fails naming it: fix the bug, then commit the input
# to tests/fixtures/fuzz/TARGET/, which every run replays first.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
fuzz_dir=${BUILD_DIR:-$root/build}/fuzz
targets=(jinja_fuzzer tokenizer_json_fuzzer chat_line_fuzzer image_fuzzer safetensors_fuzzer
  pipeline_fuzzer)

usage() {
  echo "usage: $0 build | run TARGET [SECONDS] | all [SECONDS]" >&2
  echo "targets: ${targets[*]}" >&2
  exit 2
}

build() {
  if ! command -v clang++ >/dev/null 2>&1; then
    echo "$0: clang++ is missing; fuzzing needs clang and libFuzzer: apt-get install clang" \
      "libclang-rt-14-dev (scripts/setup.sh installs them)" >&2
    exit 1
  fi
  local launcher=()
  command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  if [ ! -f "$fuzz_dir/build.ninja" ]; then
    cmake -S "$root/fuzz" -B "$fuzz_dir" -G Ninja -DCMAKE_CXX_COMPILER=clang++ \
      -DENGINE_PYTHON="$root/.venv/bin/python" "${launcher[@]}"
  fi
  cmake --build "$fuzz_dir" -j "${JOBS:-$(nproc)}"
}

# Writes TARGET's seeds (from the tests' fixtures) into $1.
seeds() {
  local target=$1 dir=$2 fixtures=$root/tests/fixtures
  rm -rf "$dir"
  mkdir -p "$dir"
  case "$target" in
    jinja_fuzzer) cp "$fixtures"/chat_templates/*.jinja "$dir"/ ;;
    tokenizer_json_fuzzer) cp "$fixtures"/tokenizers/*.json "$dir"/ ;;
    chat_line_fuzzer)
      split -l 1 "$fixtures/chat_data/conversations.jsonl" "$dir/line_"
      printf '%s\n' '{"conversations": [{"from": "human", "value": "<image>Hi"}, {"from": "gpt", "value": "Yo"}], "system": "S", "images": ["a.png"]}' >"$dir/sharegpt"
      printf '%s\n' '{"instruction": "Add", "input": "1 1", "output": "2", "system": "S"}' >"$dir/alpaca"
      printf '%s\n' '{"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "image"}]}, {"role": "assistant", "content": "Yo"}], "image": "a.png"}' >"$dir/parts"
      ;;
    image_fuzzer) cp "$fixtures"/hf/qwen2_vl/images/* "$dir"/ ;;
    safetensors_fuzzer)
      find "$fixtures/hf" -name '*.safetensors' -size -64k -exec cp --backup=numbered {} "$dir"/ \;
      ;;
    pipeline_fuzzer) cp "$root"/pipelines/*.pbtxt "$dir"/ ;;
  esac
}

run() {
  local target=$1 seconds=${2:-60}
  local bin=$fuzz_dir/bin/$target
  [ -x "$bin" ] || {
    echo "$0: $bin is not built: run $0 build" >&2
    exit 1
  }
  local regressions=$root/tests/fixtures/fuzz/$target
  local artifacts=$fuzz_dir/artifacts/$target/ corpus=$fuzz_dir/corpus/$target
  local seed_dir=$fuzz_dir/seeds/$target
  mkdir -p "$artifacts" "$corpus"
  local options=(-timeout=30 -rss_limit_mb=4096 -artifact_prefix="$artifacts" -print_final_stats=1)
  [ -f "$root/fuzz/$target.dict" ] && options+=(-dict="$root/fuzz/$target.dict")
  local inputs=()
  [ -d "$regressions" ] && mapfile -t inputs < <(find "$regressions" -type f ! -name '.*' | sort)
  if [ ${#inputs[@]} -gt 0 ]; then
    echo "== $target: replaying ${#inputs[@]} regression inputs"
    "$bin" "${options[@]}" "${inputs[@]}" || fail "$target" "$regressions/*"
  fi
  seeds "$target" "$seed_dir"
  rm -f "$artifacts"*
  echo "== $target: fuzzing for $seconds s"
  if ! "$bin" "${options[@]}" -max_total_time="$seconds" "$corpus" "$seed_dir"; then
    local found
    found=$(find "$artifacts" -type f | head -1)
    fail "$target" "${found:-(no input saved: see the output above)}"
  fi
}

# fail TARGET INPUT: what crashed, and how to go on.
fail() {
  echo "$0: $1 crashed, hung or ran out of memory on $2" >&2
  echo "  reproduce: $fuzz_dir/bin/$1 $2" >&2
  echo "  fix the bug, then commit the input to tests/fixtures/fuzz/$1/ (every run replays it)" >&2
  exit 1
}

case "${1:-}" in
  build) build ;;
  run)
    [ $# -ge 2 ] || usage
    printf '%s\n' "${targets[@]}" | grep -qx "$2" || usage
    run "$2" "${3:-60}"
    ;;
  all)
    build
    for t in "${targets[@]}"; do run "$t" "${2:-60}"; done
    ;;
  *) usage ;;
esac
