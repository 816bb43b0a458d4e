#!/usr/bin/env bash
# The built-in plugins export nothing of LibTorch's module API (torch::) or the engine's own
# (engine::) beside their two entry points: a plugin that exported LibTorch's inline functions (as
# one compiled against a precompiled header of default visibility did) would bind other libraries'
# calls to its copies. (at::Tensor::to, exported by the NF4 plugin through libengine_kernels.a,
# predates this check.)
#   plugin_exports_test.sh PLUGIN_DIR
set -euo pipefail
plugin_dir=$1
status=0
count=0
for plugin in "$plugin_dir"/*.so; do
  count=$((count + 1))
  exported=$(nm -D --defined-only "$plugin" | c++filt |
    grep -E ' [A-Za-z] (\w+::)*(torch|engine)::' || true)
  if [ -n "$exported" ]; then
    echo "$plugin exports torch:: or engine:: symbols:" >&2
    echo "$exported" | head -5 >&2
    status=1
  fi
done
if [ "$count" -eq 0 ]; then
  echo "no plugin in $plugin_dir" >&2
  exit 1
fi
if [ "$status" -eq 0 ]; then
  echo "$count plugins export nothing of torch:: or engine:: beside their entry points"
fi
exit $status
