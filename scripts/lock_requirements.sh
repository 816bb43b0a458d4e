#!/usr/bin/env bash
# Writes requirements.txt from requirements.in: every package the environment needs, pinned by
# version and by the hashes of its files on PyPI (pip-tools' pip-compile, in a throwaway
# environment). Run after changing requirements.in; scripts/setup.sh then installs the new set.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tools=$(mktemp -d)
trap 'rm -rf "$tools"' EXIT
/usr/bin/python3 -m venv "$tools"
"$tools/bin/pip" install --disable-pip-version-check -q pip-tools
cd "$root"
"$tools/bin/pip-compile" --quiet --generate-hashes --allow-unsafe --strip-extras \
  --no-emit-index-url --output-file requirements.txt requirements.in
