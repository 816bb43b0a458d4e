#!/usr/bin/env bash
# Run on the GPU machine from the project's root: `bash .devdeps/build.sh [ctest args...]`.
# Unpacks the carried Debian packages into /opt/devdeps (never into /), then configures and builds the project
# against the machine's LibTorch (CUDA) into /tmp/build-gpu, and runs ctest with the given arguments
# (none: build only). Set CMAKE_ARGS for extra configure flags, BUILD_TARGETS to build only some.
#
# The project's fixed copy of ../shared/device/build.sh: after `bash ../shared/device/fetch-debs.sh`,
# run `cp scripts/device_build.sh .devdeps/build.sh`. Differences, each found on the H100 machine:
#   - the cmake-file rewrite no longer ends the script when grep matches nothing (set -e + pipefail);
#   - glog's module path (/usr/share/glog/cmake, for FindUnwind) is pointed at the prefix;
#   - Ninja, and -k 0 so that one run shows every compile error.
# pip's torch ships no Gloo headers (src/dist needs them): fetch with EXTRA_DEBS=libgloo-dev. Only the
# headers are used; the library stays torch's own (the .deb's libgloo.so link points nowhere there).
# After the build, tests need LD_LIBRARY_PATH=/opt/devdeps/usr/lib/x86_64-linux-gnu as well.
set -euo pipefail
root=$(pwd)
prefix=/opt/devdeps
mkdir -p "$prefix"
for d in "$root"/.devdeps/*.deb; do dpkg -x "$d" "$prefix"; done
# Debian's boost/cmake files name absolute /usr paths; point them at the prefix.
grep -rlZ '/usr/include' "$prefix/usr/lib/x86_64-linux-gnu/cmake" 2>/dev/null | xargs -0 -r sed -i "s#\"/usr/include#\"$prefix/usr/include#g; s#/usr/lib/x86_64-linux-gnu#$prefix/usr/lib/x86_64-linux-gnu#g" || true
sed -i "s#\"/usr/share/glog#\"$prefix/usr/share/glog#g" "$prefix/usr/lib/x86_64-linux-gnu/cmake/glog/glog-modules.cmake" || true
export PATH="$prefix/usr/bin:$PATH"
export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
torch_cmake=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
echo "LibTorch: $(python3 -c 'import torch; print(torch.__version__, torch.version.cuda)')"
nvidia-smi --query-gpu=name,compute_cap,memory.total --format=csv,noheader || true
cmake -G Ninja -S "$root" -B /tmp/build-gpu -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$torch_cmake;$prefix/usr;$prefix/usr/lib/x86_64-linux-gnu/cmake" \
  -DProtobuf_PROTOC_EXECUTABLE="$prefix/usr/bin/protoc" ${CMAKE_ARGS:-}
cmake --build /tmp/build-gpu -j"$(nproc)" ${BUILD_TARGETS:+--target $BUILD_TARGETS} -- -k 0
if [ $# -gt 0 ]; then (cd /tmp/build-gpu && ctest "$@"); fi
