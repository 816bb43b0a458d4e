"""Writes tests/fixtures/chat_templates/jinja_features.json: template snippets exercising the
Jinja features chat templates use, with what transformers' own Jinja2 environment (the one
apply_chat_template compiles templates in) renders for each. jinja_render_test.cc asserts the
engine renders the same.

    .venv/bin/python tests/chat/jinja_features.py
"""
import json
import os

# Private, but it is the environment apply_chat_template renders in, not a copy of it.
from transformers.utils.chat_template_utils import _compile_jinja_template

SNIPPETS = [
 ("{% for m in messages %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }}/{{ loop.previtem }}/{{ loop.nextitem }};{% endfor %}", {"messages": ["a","b","c"]}),
 ("{% for x in xs if x is odd %}{{ x }}{{ loop.length }}{% else %}none{% endfor %}|{% for x in [] %}x{% else %}empty{% endfor %}", {"xs": [1,2,3,4,5]}),
 ("{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}{% for k in d %}{{ k }}{% endfor %}", {"d": {"b": 1, "a": 2}}),
 ("{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}", {"xs": [1,2,3,4,5]}),
 ("{% set ns = namespace(n=0, found=false) %}{% for x in [1,2,3] %}{% set ns.n = ns.n + x %}{% set local = x %}{% endfor %}{{ ns.n }} {{ local is defined }}", {}),
 ("{% set a, b = 1, 'two' %}{{ a }}{{ b }}{% set block %}  x {{ a }} {% endset %}[{{ block }}]", {}),
 ("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', punct='?') }}", {}),
 ("{% macro wrap() %}<{{ caller() }}>{% endmacro %}{% call wrap() %}inner{% endcall %}", {}),
 ("{% filter upper %}shout {{ 'this' }}{% endfilter %}", {}),
 ("{{ 'x' ~ 1 ~ none ~ true }}|{{ 'a' + 'b' }}|{{ [1] + [2] }}|{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 7 / 2 }} {{ 'ab' * 3 }}", {}),
 ("{{ 1 < 2 < 3 }} {{ 'a' in 'cat' }} {{ 'z' not in ['a'] }} {{ 'k' in {'k': 1} }} {{ not 0 }} {{ 0 or 'fallback' }} {{ 1 and 'both' }} {{ [] or none }}", {}),
 ("{{ 'yes' if x else 'no' }}|{{ 'only' if x }}|{{ 1 if false else 2 if false else 3 }}", {"x": ""}),
 ("{{ s[1:3] }}|{{ s[::-1] }}|{{ s[-2:] }}|{{ xs[::2] }}|{{ xs[-1] }}|{{ s[0] }}|{{ xs[1:][0] }}", {"s": "héllo", "xs": [1,2,3,4]}),
 ("{{ '  a b  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '\\n\\nhi\\n'.lstrip('\\n') }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a-b-c'.rsplit('-', 1) }}", {}),
 ("{{ 'Hello'.startswith('He') }} {{ 'Hello'.endswith(('x', 'lo')) }} {{ 'hello world'.title() }} {{ 'hELLO'.capitalize() }} {{ 'a.b'.replace('.', '-') }} {{ 'abcabc'.find('c') }} {{ 'abcabc'.count('b') }} {{ ', '.join(['a', 'b']) }}", {}),
 ("{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 9) }} {{ d.keys() | list }} {{ d.values() | list }} {{ d['a'] }} {{ d.a }}", {"d": {"a": 1, "b": [2]}}),
 ("{{ '  x ' | trim }}|{{ 'ab' | upper }}|{{ 'AB' | lower }}|{{ 'hello-world foo' | title }}|{{ 'hello' | capitalize }}|{{ [1,2,3] | length }}|{{ 'héllo' | length }}|{{ [3,1,2] | first }}|{{ [3,1,2] | last }}|{{ [1,2] | join('-') }}|{{ 'a.b' | replace('.', '') }}", {}),
 ("{{ u | default('d') }}|{{ '' | default('d') }}|{{ '' | default('d', true) }}|{{ 3 | string }}|{{ '42' | int + 1 }}|{{ 'x' | int }}|{{ '2.5' | float }}|{{ 2.567 | round(1) }}|{{ -3 | abs }}|{{ 'ab' | list }}|{{ {'a': 1} | items | list }}", {}),
 ("{{ [3,1,2] | sort }}|{{ ['b','A','c'] | sort }}|{{ [3,1,2] | sort(reverse=true) }}|{{ xs | sort(attribute='n') | map(attribute='n') | list }}|{{ [1,1,2] | unique | list }}|{{ [1,2] | reverse | list }}|{{ [1,5,3] | max }}|{{ [4,2] | min }}|{{ [1,2,3] | sum }}", {"xs": [{"n": 2}, {"n": 1}]}),
 ("{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(',') }}|{{ ms | rejectattr('role', 'eq', 'user') | list | length }}|{{ [1,2,3,4] | select('even') | list }}|{{ [0,1,''] | select | list }}|{{ ms | map(attribute='missing', default='-') | list }}|{{ ['a','b'] | map('upper') | list }}", {"ms": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]}),
 ("{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ 'é\"\\n' | tojson }}|{{ 'é' | tojson(ensure_ascii=true) }}|{{ d | tojson(sort_keys=true) }}|{{ [] | tojson(indent=2) }}|{{ 1.0 | tojson }}|{{ none | tojson }}", {"d": {"z": [1, 2.5, True, None], "a": {"k": "v"}}}),
 ("{{ 'line1\\nline2\\n\\nline4' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent(first=true, blank=true) }}", {}),
 ("{{ x is defined }} {{ u is undefined }} {{ none is none }} {{ 's' is string }} {{ 1 is number }} {{ true is number }} {{ 1 is integer }} {{ 1.5 is float }} {{ {} is mapping }} {{ 's' is iterable }} {{ [] is sequence }} {{ true is true }} {{ 0 is false }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 'a' is in 'cat' }} {{ 'ABC' is upper }} {{ 2 is eq 2 }} {{ x is not none }}", {"x": 1}),
 ("{{ u }}|{{ u | length }}|{{ u | list }}|{{ 'a' in u }}|{% for x in u %}x{% endfor %}|{{ u is iterable }}|{{ '' ~ u ~ '' }}|{% if u %}t{% else %}f{% endif %}", {}),
 ("{{ range(3) | list }}|{{ range(1, 7, 2) | list }}|{{ dict(a=1).a }}|{% for i in range(3) %}{{ loop.cycle('x', 'y') }}{% endfor %}", {}),
 ("a\n  {% if true %}\n    b\n  {% endif %}\n  c {# comment #}\n{#- stripped -#}\n  d\n{{- ' e' -}}\n   f  {%- if true %}  g{% endif -%}  \n", {}),
 ("{% raw %}{{ not rendered }}{% endraw %}|{{ \"a\" 'b' }}|{{ '\\u00e9\\x41\\t' }}", {}),
 ("{% if a %}A{% elif b %}B{% else %}C{% endif %}{% if not a and b or c %}!{% endif %}", {"a": 0, "b": 1, "c": 0}),
 ("{{ 1e3 }} {{ 0.1 + 0.2 }} {{ 10 / 4 }} {{ 2.0 }} {{ -0.0 }} {{ 1_000 }} {{ 123456789012345678.0 }} {{ 0.0001 }}", {}),
 ("{{ messages[0]['content'] }}{{ messages[0].content }}{{ messages[-1].role }}", {"messages": [{"role": "user", "content": "x"}, {"role": "a"}]}),
]


def main():
    out = []
    for template, variables in SNIPPETS:
        try:
            result = {"text": _compile_jinja_template(template).render(**variables)}
        except Exception as error:  # noqa: BLE001 - a failure is an expected result too
            result = {"error": f"{type(error).__name__}: {error}"}
        out.append({"template": template, "variables": variables, **result})
    path = os.path.join(os.path.dirname(__file__), "..", "fixtures", "chat_templates",
                        "jinja_features.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
