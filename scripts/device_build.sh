#!/usr/bin/env bash
# Builds and tests the engine on the GPU machine, against that machine's LibTorch (pip's, with CUDA),
# from the Debian packages carried in .devdeps/ (the machine reaches no package registry).
#
# Here, once:   EXTRA_DEBS="libgloo-dev libpng-dev libpng16-16 libjpeg62-turbo-dev libjpeg62-turbo" \
#                 bash ../shared/device/fetch-debs.sh
#               cp scripts/device_build.sh .devdeps/build.sh
# There:        bash .devdeps/build.sh [ctest arguments...]    # none: build only
#
# The packages are unpacked into /opt/devdeps (never into /), the project is configured with Ninja
# into /tmp/build-gpu and built with -k 0, so one run shows every compile error. CMAKE_ARGS adds
# configure flags, BUILD_TARGETS builds only some targets. Tests need
# LD_LIBRARY_PATH=/opt/devdeps/usr/lib/x86_64-linux-gnu (exported here for ctest).
#
# Why the steps below are as they are:
#   - Debian's cmake files name absolute /usr paths, and glog's module path (/usr/share/glog, for
#     FindUnwind) too: they are rewritten to the prefix; a rewrite that matches nothing is fine.
#   - pip's torch ships no Gloo headers (src/dist needs them): libgloo-dev's headers are used with
#     torch's own Gloo library (the package's libgloo.so link points nowhere there).
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
