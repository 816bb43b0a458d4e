#!/usr/bin/env python3
"""The layers of engine/src, in the order of the data flow, and the rule between them: a folder
includes only folders listed before it (and the SDK, engine/...), never one after it; a built-in
plugin includes only the SDK and its own files. Fails naming every include that breaks the rule.

  python3 tests/sdk/layering_test.py ROOT

Then it proves itself on a small tree of its own: an upward include and a plugin including an
engine internal fail, naming the file and the include.
"""
import pathlib
import re
import sys
import tempfile

# Lowest first. What each is: docs/building.md#layout.
LAYERS = [
    "core", "jinja", "chat", "tokenizer", "image", "plugins", "precision", "dist", "pipeline",
    "checkpoint", "text", "plan", "train", "conformance", "export", "run",
]

# Includes of engine internals by built-in plugins that predate the rule; each is to go, and no
# other may join them.
PLUGIN_EXCEPTIONS = {
    ("plugins/chat/loss_mask.h", "chat/chat_template.h"),
    ("plugins/chat/chat_examples.h", "chat/chat_template.h"),
    ("plugins/chat/chat_loader.cc", "chat/tokenizer_config.h"),
    ("plugins/chat/chat_loader.cc", "text/stage_tokenizer.h"),
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def sources(directory):
    return sorted(p for p in directory.rglob("*") if p.suffix in (".h", ".cc", ".cu", ".cuh"))


def check(root):
    """The rule's breaches under `root`, one line each."""
    root = pathlib.Path(root)
    src = root / "engine/src"
    folders = sorted(p.name for p in src.iterdir() if p.is_dir())
    errors = [f"engine/src/{f} is not among the layers of tests/sdk/layering_test.py"
              for f in folders if f not in LAYERS]
    rank = {name: i for i, name in enumerate(LAYERS)}
    for folder in folders:
        for path in sources(src / folder):
            for target in INCLUDE.findall(path.read_text(encoding="utf-8")):
                layer = target.split("/")[0]
                if layer in rank and folder in rank and rank[layer] > rank[folder]:
                    errors.append(f"{path.relative_to(root)} includes {target}: {layer}/ comes "
                                  f"after {folder}/ in the data flow")
    for path in sources(root / "plugins"):
        relative = path.relative_to(root).as_posix()
        for target in INCLUDE.findall(path.read_text(encoding="utf-8")):
            if target.split("/")[0] in rank and (relative, target) not in PLUGIN_EXCEPTIONS:
                errors.append(f"{relative} includes {target}: plugins see only the SDK "
                              f"(engine/...) and their own files")
    return errors


def breaches_are_found():
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        for layer in LAYERS:
            (root / "engine/src" / layer).mkdir(parents=True)
        (root / "engine/src/plan/p.cc").write_text('#include "train/trainer.h"\n')
        (root / "engine/src/train/t.cc").write_text('#include "plan/pipeline_plan.h"\n')
        (root / "plugins/x").mkdir(parents=True)
        (root / "plugins/x/x.cc").write_text('#include "engine/model.h"\n#include "core/glob.h"\n')
        found = check(root)
        return found == [
            "engine/src/plan/p.cc includes train/trainer.h: train/ comes after plan/ in the data "
            "flow",
            "plugins/x/x.cc includes core/glob.h: plugins see only the SDK (engine/...) and their "
            "own files",
        ]


def main(root):
    errors = check(root)
    if errors:
        print("\n".join(errors), file=sys.stderr)
        return 1
    if not breaches_are_found():
        print("the check missed an upward include in its own example tree", file=sys.stderr)
        return 1
    print(f"{len(LAYERS)} layers, no include runs upward; plugins include the SDK "
          f"({len(PLUGIN_EXCEPTIONS)} older includes of engine internals excepted)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
