#!/usr/bin/env bash
# The GPU half of the work, run from binaries built here: the tests that need a GPU, the CUDA
# kernels' benchmark, and the engine against transformers + PEFT on the same GPU. The GPU machine
# is lent for minutes, so nothing is built there: `pack` bundles this machine's build (compiled with
# nvcc against the same torch 2.11.0+cu130 wheel the GPU machine's Python has) with the Debian
# libraries it loads, and every other step runs from that bundle.
#
# Here:   scripts/setup.sh build && scripts/device_perf.sh pack    # writes .devbundle/ (~21 MB)
# There:  device run, carry [".devbundle"]:
#           bash scripts/device_perf.sh env kernels tests peft qlora  # logs, JSON into $OUT
#           bash scripts/device_perf.sh vl                            # a second run
#         (a run may take 10 minutes, the machine 15 in all, its starts included)
#         a dry run here (no CUDA: the GPU tests skip, the benchmarks refuse) checks the rest:
#           OUT=/tmp/dry scripts/device_perf.sh env tests
#
# Steps, in the order given (a failing step is reported, the next still runs, the exit status is
# the first failure's):
#   env      the card, the driver, the Python packages the references use
#   tests    ctest -L gpu (the CUDA kernels against the CPU ones) and every test that runs on CUDA
#            when there is one (the one-read step, NCCL with one rank, the device choice)
#   kernels  nf4_cuda_bench: NF4 dequantize and fused AdamW against a device copy, the 4-bit matmul
#            against a dense one
#   peft     bench/gpu_vs_peft.py for Qwen2.5-0.5B's and Llama-3.2-1B's configs (random weights),
#            LoRA with checkpointing off and on
#   qlora    the same with the base in 4 bits: the engine's NF4 against PEFT on bitsandbytes
#   vl       bench/gpu_vl_vs_peft.py: recipe r3's two stages at Qwen2-VL-2B's shape (random
#            weights), 8 images of 448 x 448 a step, against transformers (+ PEFT) doing each stage
#
# Why the bundle is laid out as it is: the binaries, CTest's files and the tests name this
# machine's absolute paths (the build tree, the source tree, .venv's LibTorch and Python), so the
# unpack step recreates those paths there as links to the copy of the tree, the machine's own
# site-packages (LibTorch and the CUDA libraries beside it) and its python3.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bundle_dir=$root/.devbundle
bundle=$bundle_dir/bundle.tar.xz
here_root=/work/main   # where this machine's build lives: the paths compiled into it
out=${OUT:-/tmp/device_perf}
status=0

# Bundles build/ (binaries, libraries, plugins, CTest's files), the Debian libraries they load that
# a stock Ubuntu with CUDA lacks, bitsandbytes' Python package with its CUDA 13.0 library only, and
# the fortunes (the benchmarks' text).
pack() {
  local stage
  stage=$(mktemp -d)
  trap 'rm -rf "$stage" "$stage.list"' RETURN
  (cd "$root/build" && find . -path ./CMakeFiles -prune -o \( -name '*.so' -o \
    -name 'CTestTestfile.cmake' -o -name '*tests*.cmake' \) -print | grep -v /CMakeFiles/ &&
    find ./bin -type f) >"$stage.list"
  mkdir -p "$stage/build" "$stage/debian" "$stage/site" "$stage/data"
  tar -C "$root/build" -cf - -T "$stage.list" | tar -C "$stage/build" -xf -
  local libs
  libs=$(grep -v '\.cmake$' "$stage.list" | sed "s#^#$root/build/#" | xargs ldd 2>/dev/null |
    awk '/=> \/(usr\/)?lib\/x86_64-linux-gnu\//{print $3}' | sort -u |
    grep -Ev '/(libc|libm|libdl|libpthread|librt|libutil|libstdc\+\+|libgcc_s|libz|liblzma)\.so')
  for lib in $libs; do cp -L "$lib" "$stage/debian/"; done
  local site
  site=$("$root/.venv/bin/python" -c 'import bitsandbytes, os; print(os.path.dirname(bitsandbytes.__file__))')
  # transformers asks importlib.metadata whether bitsandbytes is installed: its dist-info goes too.
  (cd "$(dirname "$site")" && find bitsandbytes bitsandbytes-*.dist-info -name __pycache__ -prune -o -type f \
    ! -name 'libbitsandbytes_*.so' -print | tar -cf - -T - | tar -C "$stage/site" -xf -)
  cp "$site/libbitsandbytes_cuda130.so" "$stage/site/bitsandbytes/"
  cp -r "$root/data/." "$stage/data/"
  mkdir -p "$bundle_dir"
  tar -C "$stage" -cf - . | xz -T0 -6 >"$bundle"
  echo "$bundle: $(du -h "$bundle" | cut -f1) ($(wc -l <"$stage.list") build files," \
    "$(ls "$stage/debian" | wc -l) Debian libraries)"
}

# There: the bundle into build/ and /opt/devbundle, this machine's paths as links.
unpack() {
  [ -f "$bundle" ] || { echo "no $bundle: run 'scripts/device_perf.sh pack' here and carry .devbundle" >&2; exit 2; }
  local dest=/opt/devbundle
  rm -rf "$dest" && mkdir -p "$dest" && { xz -dc "$bundle" | tar -C "$dest" -xf - || { echo "$bundle: could not unpack" >&2; exit 2; }; }
  # A configured build is this machine's own (the dry run): it stays, as does a real .venv.
  if [ ! -f "$root/build/CMakeCache.txt" ]; then rm -rf "$root/build" && mv "$dest/build" "$root/build"; fi
  if [ "$root" != "$here_root" ]; then
    # A second run in the same machine finds the link the first one made.
    if [ "$(readlink -f "$here_root")" != "$(readlink -f "$root")" ]; then
      [ -e "$here_root" ] && { echo "$here_root exists and is not this tree" >&2; exit 2; }
      mkdir -p "$(dirname "$here_root")" && ln -s "$root" "$here_root"
    fi
  fi
  local site venv=$root/.venv
  if [ ! -f "$venv/pyvenv.cfg" ]; then
    site=$(python3 -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))')
    rm -rf "$venv" && mkdir -p "$venv/bin" "$venv/lib/python3.11"
    ln -s "$site" "$venv/lib/python3.11/site-packages"
    printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" >"$venv/bin/python"
    chmod +x "$venv/bin/python"
  fi
  mkdir -p "$root/data" && cp -rn "$dest/data/." "$root/data/"
  # libengine.so needs libcudart itself: the one torch's CUDA wheel brings, wherever it lies there.
  local cudart
  cudart=$(find -L "$venv/lib/python3.11/site-packages/nvidia" -name 'libcudart.so.13' -print -quit 2>/dev/null)
  export LD_LIBRARY_PATH="$dest/debian${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}${cudart:+:$(dirname "$cudart")}"
  export PYTHONPATH="$dest/site${PYTHONPATH:+:$PYTHONPATH}"
  local missing
  missing=$(ldd "$root"/build/bin/* "$root"/build/lib/*.so 2>/dev/null | grep 'not found' | sort -u)
  [ -z "$missing" ] || echo "libraries not found: $missing"
}

# run_step NAME LIMIT COMMAND...: COMMAND's output into NAME.log, stopped (exit 124) with all it
# started after LIMIT seconds ($STEP_LIMIT, when set, for every step), so that one slow step
# cannot spend the rest of the machine's minutes.
run_step() {
  local name=$1 limit=${STEP_LIMIT:-$2}
  shift 2
  echo "== $name: $* (at most $limit s)"
  local start=$SECONDS
  set -m   # the step and its children in a process group of their own, to stop together
  ("$@") >"$out/$name.log" 2>&1 &
  local pid=$!
  set +m
  (sleep "$limit" && kill -TERM -- "-$pid" 2>/dev/null && sleep 5 && kill -KILL -- "-$pid") \
    >/dev/null 2>&1 &
  local watchdog=$!
  wait "$pid"
  local rc=$?
  kill "$watchdog" 2>/dev/null
  if [ $((SECONDS - start)) -ge "$limit" ]; then rc=124; fi
  echo "== $name: exit $rc after $((SECONDS - start)) s (log: $name.log)"
  tail -n 30 "$out/$name.log"
  if [ $rc -ne 0 ] && [ $status -eq 0 ]; then status=$rc; fi
}

environment() {
  nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader
  "$py" -c 'import torch, transformers, peft; print("torch", torch.__version__, torch.version.cuda,
    "transformers", transformers.__version__, "peft", peft.__version__)'
  "$py" -c 'import bitsandbytes; print("bitsandbytes", bitsandbytes.__version__)'
  uname -a
}

peft_bench() {
  local mode=$1 model
  for model in qwen2.5-0.5b llama-3.2-1b; do
    "$py" "$root/bench/gpu_vs_peft.py" --model "$model" --engine "$root/build/bin/engine" \
      --steps 10 --warmup 2 ${mode:+--$mode} --json "$out/gpu_vs_peft_${model}${mode:+_$mode}.json" \
      --checkpoint-cache /tmp/gpu_vs_peft_checkpoints || return
  done
}

# ctest runs a suite per process, so the tests that run on CUDA are picked by name from each test
# binary, the binaries side by side; any failure fails the step after all have ended.
gpu_tests() {
  (cd "$root/build" && ctest -L gpu --output-on-failure) || return
  local filter='*OnAGpu*:*OnTheGpu*:*DeviceCapability*:*PipelineLoader*:*DigitsMlp*:*Precision*'
  local binary pids=() failed=0
  for binary in engine_unit_tests engine_plugin_tests engine_transformer_tests engine_kernel_tests \
    engine_e2e_tests; do
    ENGINE_PLUGIN_PATH= "$root/build/bin/$binary" --gtest_filter="$filter" \
      >"$out/gpu_tests_$binary.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  grep -h -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out"/gpu_tests_*.log
  return $failed
}

if [ "${1:-}" = pack ]; then pack; exit; fi
mkdir -p "$out"
unpack
py=$root/.venv/bin/python   # there, a wrapper of the machine's python3
export PYTHONUNBUFFERED=1
# Seconds each step may take: on an H200 (2026-11-29) env, kernels and tests took 25, 3 and 40 s,
# peft 135 s (before the checkpoints were shared), qwen2.5's half of qlora about 100 s; vl is a
# guess.
for step in "$@"; do
  case $step in
    env) run_step env 60 environment ;;
    tests) run_step gpu_tests 240 gpu_tests ;;
    kernels) run_step nf4_cuda_bench 60 "$root/build/bin/nf4_cuda_bench" ;;
    peft) run_step gpu_vs_peft 240 peft_bench "" ;;
    qlora) run_step gpu_vs_peft_qlora 300 peft_bench qlora ;;
    vl) run_step gpu_vl_vs_peft 400 "$py" "$root/bench/gpu_vl_vs_peft.py" \
      --engine "$root/build/bin/engine" --json "$out/gpu_vl_vs_peft.json" \
      --checkpoint-cache /tmp/gpu_vs_peft_checkpoints ;;
    *) echo "unknown step '$step' (pack, env, tests, kernels, peft, qlora, vl)" >&2; exit 2 ;;
  esac
done
# Everything in one file too, named to sort first: the device tool brings back only so many files.
tar -C "$out" --exclude=0_results.tgz -czf "$out/0_results.tgz" . 2>/dev/null
exit $status
