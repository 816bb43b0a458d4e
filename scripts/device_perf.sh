#!/usr/bin/env bash
# The GPU half of the performance work, in as few device calls as the time allows: the CUDA build,
# the tests that need a GPU (the kernels, and a causal LM step that must read the device once and
# copy nothing else to the host), the CUDA kernels' benchmark, and the engine against transformers +
# PEFT. Logs and JSON go to $OUT (the device tool brings that folder back).
#
# Here, once:   EXTRA_DEBS="libgloo-dev libpng-dev libpng16-16 libjpeg62-turbo-dev libjpeg62-turbo" \
#                 bash ../shared/device/fetch-debs.sh
#               cp scripts/device_build.sh .devdeps/build.sh
# There (device tool, carry [".devdeps", "data"]: the fortunes and the digit chat, ~10 MB):
#   bash scripts/device_perf.sh build tests kernels     # first call: about 6-8 minutes
#   bash scripts/device_perf.sh peft                    # second call, on the still warm machine
#
# Steps, in the order given:
#   build    .devdeps/build.sh into /tmp/build-gpu (kept while the machine stays warm)
#   tests    ctest -L gpu, and the GPU twin of the one-read step test
#   kernels  build/bin/nf4_cuda_bench: NF4 dequantize and fused AdamW against a device copy, the
#            4-bit matmul against a dense one
#   peft     bench/gpu_vs_peft.py, LoRA (checkpointing off and on) and QLoRA, TinyLlama-1.1B's shape
# A failing step is reported and the next one still runs; the exit status is the first failure's.
set -uo pipefail
out=${OUT:-/tmp/device_perf}
build=/tmp/build-gpu
mkdir -p "$out"
export LD_LIBRARY_PATH="/opt/devdeps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
status=0

run_step() {
  local name=$1
  shift
  echo "== $name: $*"
  local start=$SECONDS
  "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc after $((SECONDS - start)) s (log: $name.log)"
  tail -n 25 "$out/$name.log"
  if [ $rc -ne 0 ] && [ $status -eq 0 ]; then status=$rc; fi
}

for step in "$@"; do
  case $step in
    build) run_step build bash .devdeps/build.sh ;;
    tests)
      run_step gpu_tests bash -c "cd $build && ctest -L gpu --output-on-failure"
      run_step one_read_step "$build/bin/engine_unit_tests" \
        --gtest_filter='TrainerTest.ACausalLmStepOnAGpu*' ;;
    kernels) run_step nf4_cuda_bench "$build/bin/nf4_cuda_bench" ;;
    peft)
      run_step gpu_vs_peft python3 bench/gpu_vs_peft.py --engine "$build/bin/engine" \
        --json "$out/gpu_vs_peft.json"
      run_step gpu_vs_peft_qlora python3 bench/gpu_vs_peft.py --engine "$build/bin/engine" \
        --qlora --checkpointing on --json "$out/gpu_vs_peft_qlora.json" ;;
    *) echo "unknown step '$step' (build, tests, kernels, peft)" >&2; exit 2 ;;
  esac
done
exit $status
