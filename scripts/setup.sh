#!/usr/bin/env bash
# Sets up a Debian 12 machine for the engine and then runs the main job or the tests:
#
#   scripts/setup.sh main    # install what is missing, build the engine and its plugins, train
#                            # pipelines/qwen2_vl_r3.pbtxt
#   scripts/setup.sh test    # install what is missing, build everything, run every test
#   scripts/setup.sh build   # install what is missing, build everything
#   scripts/setup.sh bench   # install what is missing, build, run the LM benchmark against PyTorch
#
# Runs as root or as a user with sudo (only apt-get needs it). Everything is incremental: packages
# already installed are not touched, the Python environment (.venv, from requirements.txt) is
# installed again only when requirements.txt changed, the data is fetched once, the build only
# redoes what changed.
# Environment: BUILD_DIR (default: build), JOBS (default: all cores), CTEST_ARGS (extra ctest
# flags), CI (when true, a build without nvcc is an error instead of a CPU-only build).
set -euo pipefail

mode=${1:-}
case "$mode" in
  main | test | build | bench) ;;
  *)
    echo "usage: $0 main|test|build|bench" >&2
    exit 2
    ;;
esac

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${BUILD_DIR:-$root/build}
jobs=${JOBS:-$(nproc)}
data_dir=$root/data
venv=$root/.venv

say() { printf '\033[1m== %s\033[0m\n' "$*"; }

if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1; then
  sudo=(sudo)
else
  echo "$0: installing packages needs root: run as root, or install and configure sudo" >&2
  exit 1
fi

# --- Debian packages -------------------------------------------------------------------------
packages=(
  g++ cmake ninja-build ccache
  libgloo-dev
  protobuf-compiler libprotobuf-dev
  libgoogle-glog-dev libgflags-dev
  libboost-dev nlohmann-json3-dev zlib1g-dev libsentencepiece-dev pkg-config libxxhash-dev
  libpcre2-dev libicu-dev libpng-dev libjpeg62-turbo-dev
  libgtest-dev libgmock-dev
  clang libclang-rt-14-dev
  python3-venv
)
missing=()
for p in "${packages[@]}"; do
  if [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null)" != "installed" ]; then
    missing+=("$p")
  fi
done
apt_updated=0
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  "${sudo[@]}" apt-get update -qq
  apt_updated=1
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}"
fi

# --- The Python environment: torch (the LibTorch the engine links) and the references ---------
# Installed again only when requirements.txt changed; the stamp is written last, so an install
# that failed half-way is finished by the next run. --require-hashes: a package whose hash differs
# from requirements.txt's is refused, never installed.
venv_stamp=$venv/.requirements.sha256
want_stamp=$(sha256sum "$root/requirements.txt" | cut -d' ' -f1)
if [ "$(cat "$venv_stamp" 2>/dev/null)" != "$want_stamp" ]; then
  say "installing the Python environment .venv from requirements.txt (about 3.5 GB to download)"
  rm -f "$venv_stamp"
  if [ ! -x "$venv/bin/python" ]; then
    /usr/bin/python3 -m venv "$venv"
  fi
  if ! "$venv/bin/python" -m pip install --disable-pip-version-check --no-input -q \
      --require-hashes --no-deps -r "$root/requirements.txt"; then
    echo "$0: installing requirements.txt into $venv failed (above: which package, and why)" >&2
    exit 1
  fi
  if ! "$venv/bin/python" -m pip check >/dev/null; then
    "$venv/bin/python" -m pip check >&2 || true
    echo "$0: $venv is inconsistent (above); remove it and run $0 again" >&2
    exit 1
  fi
  echo "$want_stamp" >"$venv_stamp"
fi

# --- CUDA: nvcc compiles the kernels; torch's wheel brings the CUDA libraries they run with -----
# One toolkit, named the same way on every run (the build's flags, and so ccache's hits, depend on
# the path it is found at): CUDA_HOME, else /usr/local/cuda.
if [ -z "${CUDA_HOME:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDA_HOME=/usr/local/cuda
fi
if [ -n "${CUDA_HOME:-}" ] && [ -x "$CUDA_HOME/bin/nvcc" ]; then
  export PATH=$CUDA_HOME/bin:$PATH
fi
cmake_args=(-DENGINE_PYTHON="$venv/bin/python")
if [ "${CI:-}" = true ]; then
  cmake_args+=(-DENGINE_REQUIRE_CUDA=ON)
fi

# --- Data, taken out of Debian packages (downloaded, unpacked in a temporary directory) ---------
# download_deb PACKAGE DIR: the package's .deb into DIR.
download_deb() {
  if ! (cd "$2" && apt-get download "$1" >/dev/null 2>&1); then
    if [ "$apt_updated" -eq 0 ]; then
      "${sudo[@]}" apt-get update -qq
      apt_updated=1
    fi
    (cd "$2" && apt-get download "$1" >/dev/null 2>&1) || {
      echo "$0: cannot download the Debian package $1 (needed for data/)" >&2
      rm -rf "$2"
      exit 1
    }
  fi
}

# scikit-learn's digits, from python3-sklearn.
fetch_digits() {
  local tmp rows
  tmp=$(mktemp -d)
  chmod 755 "$tmp"
  download_deb python3-sklearn "$tmp"
  dpkg -x "$tmp"/python3-sklearn_*.deb "$tmp/x"
  mkdir -p "$data_dir"
  cp "$tmp/x/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz" \
    "$data_dir/digits.csv.gz.part"
  rm -rf "$tmp"
  rows=$(gzip -dc "$data_dir/digits.csv.gz.part" | wc -l)
  if [ "$rows" -ne 1797 ]; then
    echo "$0: digits.csv.gz holds $rows rows, expected 1797" >&2
    exit 1
  fi
  mv "$data_dir/digits.csv.gz.part" "$data_dir/digits.csv.gz"
}

# The fortunes package's text files (not the offensive ones), concatenated; entries are separated
# by lines holding a single "%".
fetch_fortunes() {
  local tmp dir f count
  tmp=$(mktemp -d)
  chmod 755 "$tmp"
  download_deb fortunes "$tmp"
  dpkg -x "$tmp"/fortunes_*.deb "$tmp/x"
  dir="$tmp/x/usr/share/games/fortunes"
  mkdir -p "$data_dir"
  : >"$data_dir/fortunes.txt.part"
  for f in $(ls "$dir" | LC_ALL=C sort); do
    case "$f" in *.dat | *.u8) continue ;; esac
    [ -f "$dir/$f" ] && [ ! -L "$dir/$f" ] || continue
    cat "$dir/$f" >>"$data_dir/fortunes.txt.part"
    [ -z "$(tail -c 1 "$dir/$f")" ] || echo >>"$data_dir/fortunes.txt.part"
    [ "$(tail -n 1 "$dir/$f")" = "%" ] || echo "%" >>"$data_dir/fortunes.txt.part"
  done
  rm -rf "$tmp"
  count=$(grep -c '^%$' "$data_dir/fortunes.txt.part" || true)
  if [ "$count" -lt 5000 ]; then
    echo "$0: fortunes.txt holds $count fortunes, expected more than 5,000" >&2
    exit 1
  fi
  mv "$data_dir/fortunes.txt.part" "$data_dir/fortunes.txt"
}

if [ ! -s "$data_dir/digits.csv.gz" ]; then
  say "fetching data/digits.csv.gz from Debian's python3-sklearn"
  fetch_digits
fi
if [ ! -s "$data_dir/fortunes.txt" ]; then
  say "fetching data/fortunes.txt from Debian's fortunes"
  fetch_fortunes
fi

# --- Build -----------------------------------------------------------------------------------
# A build directory configured for another Python (or Debian's LibTorch, before .venv) starts over.
if [ -f "$build_dir/CMakeCache.txt" ] &&
   ! grep -qxF "ENGINE_PYTHON:FILEPATH=$venv/bin/python" "$build_dir/CMakeCache.txt"; then
  say "$build_dir was configured for another LibTorch: configuring it again"
  rm -rf "$build_dir"
fi
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  say "configuring $build_dir"
  cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "${cmake_args[@]}"
fi
# The main job needs the engine, its plugins and the digit data; the tests, benchmarks and test
# plugins build only for the modes that use them (about half the build).
if [ "$mode" = main ]; then
  say "building the engine and its plugins ($jobs jobs)"
  cmake --build "$build_dir" -j "$jobs" --target engine_main_job
else
  say "building ($jobs jobs)"
  cmake --build "$build_dir" -j "$jobs"
fi

case "$mode" in
  main)
    say "engine run pipelines/qwen2_vl_r3.pbtxt"
    exec "$build_dir/bin/engine" run "$root/pipelines/qwen2_vl_r3.pbtxt"
    ;;
  bench)
    say "bench/lm_vs_pytorch.py"
    exec "$venv/bin/python" "$root/bench/lm_vs_pytorch.py" --build "$build_dir"
    ;;
  test)
    say "ctest"
    # ctest runs $jobs tests at once: one thread each, where every engine would take every core.
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
    # shellcheck disable=SC2086
    exec ctest --test-dir "$build_dir" --output-on-failure -j "$jobs" --timeout 900 ${CTEST_ARGS:-}
    ;;
esac
