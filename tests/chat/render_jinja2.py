"""Renders chat templates with Python Jinja2 set up as transformers sets it up for
apply_chat_template (an ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, loop
controls, the {% generation %} tag, a tojson filter that is json.dumps with ensure_ascii=False,
and the raise_exception and strftime_now globals). The engine's renderer is compared with it in
tests/chat/reference_render_test.cc.

    /usr/bin/python3 render_jinja2.py CASES.json > RESULTS.json

CASES.json: {"cases": [{"template_file": PATH, "variables": {...}}, ...]}
RESULTS.json: [{"text": "..."} or {"error": "...", "raised": true|false}, ...], in order.
"""
import json
import sys
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class GenerationTag(Extension):
    """{% generation %}...{% endgeneration %} renders its body (transformers records where)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


class Raised(Exception):
    pass


def raise_exception(message):
    raise Raised(message)


def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(format):
    return datetime.now().strftime(format)


def make_environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    env = make_environment()
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)["cases"]
    templates = {}
    results = []
    for case in cases:
        path = case["template_file"]
        try:
            if path not in templates:
                with open(path, encoding="utf-8") as f:
                    templates[path] = env.from_string(f.read())
            results.append({"text": templates[path].render(**case["variables"])})
        except Raised as error:
            results.append({"error": str(error), "raised": True})
        except Exception as error:  # noqa: BLE001 - every failure is a result to compare
            results.append({"error": f"{type(error).__name__}: {error}", "raised": False})
    json.dump(results, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
