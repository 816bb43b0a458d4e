"""Renders chat templates the way transformers' apply_chat_template does, by calling transformers
itself (transformers.utils.chat_template_utils.render_jinja_template: its Jinja2 environment, its
raise_exception, tojson and strftime_now, its {% generation %} tag). The engine's renderer is
compared with it in tests/chat/reference_render_test.cc.

    .venv/bin/python tests/reference/render_chat_template.py CASES.json > RESULTS.json

CASES.json: {"cases": [{"template_file": PATH, "variables": {...}}, ...]}; the variables are the
ones apply_chat_template passes (messages, tools, documents, add_generation_prompt) plus the
tokenizer's special tokens and the conversation's own.
RESULTS.json: [{"text": "..."} or {"error": "...", "raised": true|false}, ...], in order;
"raised" is true where the template itself called raise_exception.
"""
import json
import sys

import jinja2
from transformers.utils.chat_template_utils import render_jinja_template


def render(template, variables):
    variables = dict(variables)
    messages = variables.pop("messages")
    # render_jinja_template takes one list of conversations and returns one text for each.
    rendered, _ = render_jinja_template(conversations=[messages], chat_template=template,
                                        **variables)
    return rendered[0]


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)["cases"]
    templates = {}
    results = []
    for case in cases:
        path = case["template_file"]
        try:
            if path not in templates:
                with open(path, encoding="utf-8") as f:
                    templates[path] = f.read()
            results.append({"text": render(templates[path], case["variables"])})
        except jinja2.exceptions.TemplateError as error:
            # transformers' raise_exception raises TemplateError itself; Jinja's own failures
            # (UndefinedError, TemplateSyntaxError, ...) are subclasses of it.
            raised = type(error) is jinja2.exceptions.TemplateError
            results.append({"error": str(error) if raised else f"{type(error).__name__}: {error}",
                            "raised": raised})
        except Exception as error:  # noqa: BLE001 - every failure is a result to compare
            results.append({"error": f"{type(error).__name__}: {error}", "raised": False})
    json.dump(results, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
