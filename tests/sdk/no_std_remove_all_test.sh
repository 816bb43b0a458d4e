#!/usr/bin/env bash
# The pip builds of LibTorch 2.x export their own std::filesystem::remove_all, and calls from our
# code can bind to it and crash (load_bench and checkpoint_bench did). engine::RemoveTree
# (core/remove_tree.h) is the one way to remove a tree. Fails naming every call to remove_all in
# the project's C++ sources.
set -euo pipefail
root=$1
found=$(grep -rn --include='*.cc' --include='*.h' -E '(^|[^/])\bremove_all\(' \
  "$root/engine" "$root/plugins" "$root/kernels" "$root/tests" "$root/bench" "$root/examples" \
  "$root/fuzz" 2>/dev/null | grep -v '^\s*//' | grep -vE ':[0-9]+:\s*//' || true)
if [ -n "$found" ]; then
  echo "calls to remove_all; use engine::RemoveTree (core/remove_tree.h) instead:" >&2
  echo "$found" >&2
  exit 1
fi
echo "no call to remove_all"
