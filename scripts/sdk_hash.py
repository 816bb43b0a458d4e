#!/usr/bin/env python3
"""The plugin SDK's fingerprint: what a third-party plugin compiles against (the installed headers
engine/include/engine/*.h and cmake/version.h.in, and the installed proto/engine/*.proto), hashed
without comments and with whitespace collapsed, so that only a change a compiler sees counts.

engine/sdk_api.lock records the hash with the ENGINE_PLUGIN_API_VERSION it belongs to.

  python3 scripts/sdk_hash.py [ROOT]            check: exit 1 when the SDK changed and the lock
                                                 still names the API version in plugin_abi.h
  python3 scripts/sdk_hash.py --record [ROOT]   write the lock for the SDK as it is

A change that breaks plugins built against the recorded version needs a bump of
ENGINE_PLUGIN_API_VERSION (engine/include/engine/plugin_abi.h) before recording; a change that
breaks none (a new free function, a new header) is recorded under the same version.
"""
import hashlib
import pathlib
import re
import sys

LOCK = "engine/sdk_api.lock"
# String and character literals are kept as they are; comments become one space.
TOKENS = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|//[^\n]*|/\*.*?\*/', re.S)


def sdk_files(root):
    files = sorted((root / "engine/include/engine").glob("*.h"))
    files += [root / "cmake/version.h.in"]
    files += sorted((root / "proto/engine").glob("*.proto"))
    return files


def normalized(text):
    text = TOKENS.sub(lambda m: " " if m.group(0)[0] == "/" else m.group(0), text)
    return " ".join(text.split())


def fingerprint(root):
    digest = hashlib.sha256()
    for path in sdk_files(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\n")
        digest.update(normalized(path.read_text(encoding="utf-8")).encode() + b"\n")
    return digest.hexdigest()


def api_version(root):
    abi = (root / "engine/include/engine/plugin_abi.h").read_text(encoding="utf-8")
    found = re.search(r"^#define ENGINE_PLUGIN_API_VERSION (\d+)", abi, re.M)
    if not found:
        sys.exit("engine/include/engine/plugin_abi.h defines no ENGINE_PLUGIN_API_VERSION")
    return int(found.group(1))


def read_lock(root):
    fields = {}
    for line in (root / LOCK).read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition(" ")
            fields[key] = value
    return int(fields["api_version"]), fields["sha256"]


def main(argv):
    record = "--record" in argv
    args = [a for a in argv if a != "--record"]
    root = pathlib.Path(args[0] if args else pathlib.Path(__file__).resolve().parent.parent)
    version, digest = api_version(root), fingerprint(root)
    if record:
        (root / LOCK).write_text(
            "# The plugin SDK's fingerprint (scripts/sdk_hash.py); a test fails when the SDK\n"
            "# changes and this still names the API version in plugin_abi.h.\n"
            f"api_version {version}\nsha256 {digest}\n", encoding="utf-8")
        print(f"recorded the SDK of plugin API {version}: {digest}")
        return 0
    locked_version, locked_digest = read_lock(root)
    if digest == locked_digest and version == locked_version:
        print(f"the SDK is the one recorded for plugin API {version}")
        return 0
    if version == locked_version:
        print(f"the plugin SDK changed (its headers or protos, comments aside) while "
              f"ENGINE_PLUGIN_API_VERSION stayed {version}: {LOCK} records {locked_digest}, the "
              f"SDK now hashes to {digest}. If plugins built against API {version} break, bump "
              f"ENGINE_PLUGIN_API_VERSION in engine/include/engine/plugin_abi.h (and say why "
              f"there); then record the SDK with `python3 scripts/sdk_hash.py --record`.",
              file=sys.stderr)
    else:
        print(f"ENGINE_PLUGIN_API_VERSION is {version} but {LOCK} records the SDK of API "
              f"{locked_version}: record it with `python3 scripts/sdk_hash.py --record`.",
              file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
