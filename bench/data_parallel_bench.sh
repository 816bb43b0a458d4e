#!/usr/bin/env bash
# Data-parallel throughput on this machine: the same global batch trained by one rank (all cores)
# and by 2 ranks over Gloo on loopback (`engine run --nproc 2`, the cores split between them).
# Prints the examples per second of each and their ratio. On a 2-core machine the two ranks share the
# cores one rank already used, so expect a ratio near or below 1: DDP pays off across machines or
# GPUs, and this measures its overhead honestly.
#
# Then the overlap of communication with the backward: 2 ranks with 1 MiB buckets (several
# all-reduces, each started from inside the backward as soon as its gradients exist) against one
# bucket holding every gradient (reduced only when the backward is over, i.e. no overlap). With 2
# cores and 2 ranks no core is left for Gloo to overlap with, so expect noise around 1 there; the
# gain needs idle cores or a network to wait on.
#
# Last, SHARDED against DDP on the same 2 ranks and a larger MLP (about 50 million f32 parameters,
# whose AdamW state is 405 MB): rank 0's peak RSS (metrics.jsonl's stage_end; no optimizer state is
# checkpointed, so nothing is gathered) and the training seconds of each, with their ratios.
# shard_level 1 splits AdamW's moments (half per rank at 2 ranks) and pays an all-gather of the
# weights after each step on top of DDP's all-reduce; shard_level 2 splits the gradients too and
# reduce-scatters them instead of all-reducing, so its collectives move what DDP's move.
#
# Then checkpoints of the optimizer state on the same model and ranks: rank 0's peak RSS at
# shard_level 1 with checkpoints against DDP with checkpoints, and against shard_level 1 without
# any. Each sharded rank writes its own parts of the state, so rank 0 gathers nothing: its peak
# should stay where training puts it (a ratio near 1 to the run without checkpoints).
#
# Last, shard_level 3 against DDP on 4 ranks (two per core here) and two MLPs of 134 M f32
# parameters, one of 8 hidden layers of 4096 and one of 32 of 2048 (as many blocks as a 7B
# decoder has layers, so a gathered block is a 32nd of the model), 10 AdamW steps of 4 x 16: rank
# 0's peak RSS over the whole run (the evaluation runs a block at a time and the final checkpoint is
# written in the ranks' parts, so nothing gathers the whole model), its largest RSS at a step's end
# while training, and the training seconds, with their ratios; and first the RSS of an engine
# process training a tiny MLP, which every rank pays whatever it shards.
#
#   bash bench/data_parallel_bench.sh [build/bin/engine]
#   PARTS=level3 bash bench/data_parallel_bench.sh   # one part (or: throughput sharded checkpoints)
set -euo pipefail
engine=${1:-build/bin/engine}
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
steps=${STEPS:-300}
cores=$(nproc)

pipeline() {  # name per-rank-batch threads strategy [hidden_units...] [steps] [checkpoint_every]
  local every=${7:-0}
  local save_state=false
  [ "$every" -gt 0 ] && save_state=true
  cat <<PBTXT
output_dir: "$work/$1"
callback { plugin: "metrics_jsonl" }
stage {
  name: "s"
  model { plugin: "mlp" options { [type.googleapis.com/engine.plugins.MlpOptions] { ${5:-hidden_units: 1024 hidden_units: 1024} } } }
  data { plugin: "digits" options { [type.googleapis.com/engine.plugins.DigitsOptions] { path: "$root/data/digits.csv.gz" } } }
  precision { plugin: "fp32" }
  schedule { max_steps: ${6:-$steps} batch_size: $2 eval_batch_size: 512 checkpoint_every_steps: $every }
  checkpoint { save_optimizer_state: $save_state }
  parallel { device: "cpu" num_threads: $3 $4 }
}
PBTXT
}

seconds() {  # the stage's training seconds from its summary line
  grep -o "stage 's': [0-9,]* steps in [0-9.]* s" | sed 's/.* in \([0-9.]*\) s/\1/'
}

half=$(( cores > 1 ? cores / 2 : 1 ))
parts=${PARTS:-throughput sharded checkpoints level3}
if [[ " $parts " == *" throughput "* ]]; then
pipeline one 128 "$cores" "" > "$work/one.pbtxt"
pipeline two 64 "$half" "strategy: DDP" > "$work/two.pbtxt"
pipeline small 64 "$half" "strategy: DDP bucket_mib: 1" > "$work/small.pbtxt"
pipeline whole 64 "$half" "strategy: DDP bucket_mib: 1024" > "$work/whole.pbtxt"
one=$("$engine" run "$work/one.pbtxt" 2>/dev/null | seconds)
two=$("$engine" run --nproc 2 "$work/two.pbtxt" 2>/dev/null | seconds)
small=$("$engine" run --nproc 2 "$work/small.pbtxt" 2>/dev/null | seconds)
whole=$("$engine" run --nproc 2 "$work/whole.pbtxt" 2>/dev/null | seconds)
python3 - "$one" "$two" "$small" "$whole" "$steps" <<'PY'
import sys
one, two, small, whole = map(float, sys.argv[1:5])
steps = int(sys.argv[5])
examples = steps * 128
print(f"1 rank : {examples / one:10.0f} examples/s ({one:.2f} s for {steps} steps of 128)")
print(f"2 ranks: {examples / two:10.0f} examples/s ({two:.2f} s, 64 per rank per step)")
print(f"ratio 2 ranks / 1 rank: {one / two:.2f}")
print(f"2 ranks, 1 MiB buckets overlapping the backward: {examples / small:10.0f} examples/s")
print(f"2 ranks, one bucket after the backward:          {examples / whole:10.0f} examples/s")
print(f"ratio overlapped / not: {whole / small:.2f}")
PY
fi

big="hidden_units: 4096 hidden_units: 4096 hidden_units: 4096 hidden_units: 4096"
if [[ " $parts " == *" sharded "* ]]; then
big_steps=30
pipeline ddp 64 "$half" "strategy: DDP" "$big" "$big_steps" > "$work/ddp.pbtxt"
pipeline sharded 64 "$half" "strategy: SHARDED shard_level: 1" "$big" "$big_steps" \
  > "$work/sharded.pbtxt"
pipeline level2 64 "$half" "strategy: SHARDED shard_level: 2" "$big" "$big_steps" \
  > "$work/level2.pbtxt"
ddp=$("$engine" run --nproc 2 "$work/ddp.pbtxt" 2>/dev/null | seconds)
sharded=$("$engine" run --nproc 2 "$work/sharded.pbtxt" 2>/dev/null | seconds)
level2=$("$engine" run --nproc 2 "$work/level2.pbtxt" 2>/dev/null | seconds)
python3 - "$work" "$ddp" "$sharded" "$level2" "$big_steps" <<'PY'
import json, sys
work = sys.argv[1]
ddp, sharded, level2 = map(float, sys.argv[2:5])
steps = int(sys.argv[5])
def peak(name):
    with open(f"{work}/{name}/metrics.jsonl") as f:
        ends = [json.loads(l) for l in f if '"stage_end"' in l]
    return ends[-1]["peak_rss_bytes"] / 1e6
d, s, l2 = peak("ddp"), peak("sharded"), peak("level2")
print(f"MLP 64-4096x4-10 (50.6 M f32 parameters), 2 ranks x 64, {steps} AdamW steps:")
print(f"  DDP:                   {ddp:7.2f} s, rank 0 peak RSS {d:7.0f} MB")
print(f"  SHARDED shard_level 1: {sharded:7.2f} s, rank 0 peak RSS {s:7.0f} MB")
print(f"  SHARDED shard_level 2: {level2:7.2f} s, rank 0 peak RSS {l2:7.0f} MB")
print(f"ratio shard_level 1 / DDP: time {sharded / ddp:.2f}, peak RSS {s / d:.2f}")
print(f"ratio shard_level 2 / DDP: time {level2 / ddp:.2f}, peak RSS {l2 / d:.2f}")
PY
fi

if [[ " $parts " == *" checkpoints "* ]]; then
ck_steps=30
pipeline ddpc 64 "$half" "strategy: DDP" "$big" "$ck_steps" 10 > "$work/ddpc.pbtxt"
pipeline shardedc 64 "$half" "strategy: SHARDED shard_level: 1" "$big" "$ck_steps" 10 \
  > "$work/shardedc.pbtxt"
pipeline shardedn 64 "$half" "strategy: SHARDED shard_level: 1" "$big" "$ck_steps" \
  > "$work/shardedn.pbtxt"
for name in ddpc shardedc shardedn; do
  "$engine" run --nproc 2 "$work/$name.pbtxt" >/dev/null 2>&1
done
python3 - "$work" "$ck_steps" <<'PY'
import json, sys
work, steps = sys.argv[1], int(sys.argv[2])
def peak(name):
    with open(f"{work}/{name}/metrics.jsonl") as f:
        ends = [json.loads(l) for l in f if '"stage_end"' in l]
    return ends[-1]["peak_rss_bytes"] / 1e6
d, s, n = peak("ddpc"), peak("shardedc"), peak("shardedn")
print(f"MLP 64-4096x4-10 (50.6 M f32 parameters), 2 ranks x 64, {steps} AdamW steps; checkpoints "
      "with the optimizer state after steps 10, 20 and 30:")
print(f"  DDP, checkpoints:                    rank 0 peak RSS {d:7.0f} MB")
print(f"  SHARDED shard_level 1, checkpoints:  rank 0 peak RSS {s:7.0f} MB")
print(f"  SHARDED shard_level 1, none:         rank 0 peak RSS {n:7.0f} MB")
print(f"ratio shard_level 1 / DDP, both checkpointing: peak RSS {s / d:.2f}; "
      f"shard_level 1 checkpointing / not: {s / n:.2f}")
PY
fi

if [[ " $parts " == *" level3 "* ]]; then
pipeline tiny 16 1 "strategy: DDP" "hidden_units: 16" 3 > "$work/tiny.pbtxt"
"$engine" run --nproc 4 --oversubscribe "$work/tiny.pbtxt" >/dev/null 2>&1
level3() {  # label hidden_units...
  local label=$1 ddp4 level3
  pipeline "ddp4$label" 16 1 "strategy: DDP" "$2" 10 > "$work/ddp4$label.pbtxt"
  pipeline "level3$label" 16 1 "strategy: SHARDED shard_level: 3" "$2" 10 > "$work/level3$label.pbtxt"
  ddp4=$("$engine" run --nproc 4 --oversubscribe "$work/ddp4$label.pbtxt" 2>/dev/null | seconds)
  level3=$("$engine" run --nproc 4 --oversubscribe "$work/level3$label.pbtxt" 2>/dev/null | seconds)
  python3 - "$work" "$label" "$ddp4" "$level3" <<'PY'
import json, sys
work, label = sys.argv[1:3]
ddp, level3 = map(float, sys.argv[3:5])
def events(name, kind):
    with open(f"{work}/{name}/metrics.jsonl") as f:
        return [e for e in map(json.loads, f) if e["event"] == kind]
def peak(name):
    return events(name, "stage_end")[-1]["peak_rss_bytes"] / 1e6
def training(name):
    return max(e["rss_bytes"] for e in events(name, "step_end")) / 1e6
dp, lp = peak("ddp4" + label), peak("level3" + label)
dt, lt = training("ddp4" + label), training("level3" + label)
tiny = peak("tiny")
print(f"MLP 64-{label}-10 (134 M f32 parameters), 4 ranks x 16, 10 AdamW steps:")
print(f"  DDP:                   {ddp:7.2f} s, rank 0 peak RSS {dp:7.0f} MB, at steps' ends {dt:7.0f} MB")
print(f"  SHARDED shard_level 3: {level3:7.2f} s, rank 0 peak RSS {lp:7.0f} MB, at steps' ends {lt:7.0f} MB")
print(f"ratio shard_level 3 / DDP: time {level3 / ddp:.2f}, peak RSS {lp / dp:.2f}, "
      f"at steps' ends {lt / dt:.2f}, above the tiny process's {(lt - tiny) / (dt - tiny):.2f}")
PY
}
echo "an engine process training MLP 64-16-10 on 4 ranks: peak RSS" \
  "$(grep -o '"peak_rss_bytes":[0-9]*' "$work/tiny/metrics.jsonl" | tail -1 | cut -d: -f2 |
     awk '{printf "%.0f MB", $1 / 1e6}')"
level3 4096x8 "$big $big"
level3 2048x32 "$(for _ in $(seq 32); do printf 'hidden_units: 2048 '; done)"
fi
