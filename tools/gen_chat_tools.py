#!/usr/bin/env python3
"""Chat templates that read `tools`, rendered by jinja2 with a request's tools, for
tests/tests/chat_tools.rs: writes tests/data/templates/tools-expected.json.

    PYTHONPATH=$HOME/.cache/pinch/llama-cpp-python python3 tools/gen_chat_tools.py

llama.cpp's `llama_chat_apply_template` takes no tools, so the oracle is jinja2 in
llama-cpp-python 0.3.36's `Jinja2ChatFormatter` environment (as `gen_chat_templates.py`
uses it: `trim_blocks`, `lstrip_blocks`, loop controls, its `tojson` = `json.dumps(x,
ensure_ascii=False)`), given `tools` as the OpenAI request carries them. Every
`tests/data/templates/*.jinja` whose text mentions `tools` is rendered on two
conversations (with and without a system message), generation prompt on, by
gen_chat_templates.py's `render_jinja`; `{"error": ...}` where jinja2 fails (`strftime_now`
is not passed).

`tools_json` is the JSON text pinch is given: the same tools as the request body writes
them (spaced and indented differently from json.dumps, with escapes), so that pinch's
`tojson` must re-serialize rather than copy.
"""
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from gen_chat_templates import render_jinja

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIR = os.path.join(ROOT, "tests", "data", "templates")

TOOLS_JSON = r'''[
  {"type": "function",
   "function": {"name": "get_weather",
                "description": "Current weather in a city, e.g. \"Paris\"",
                "parameters": {"type": "object",
                               "properties": {"city": {"type": "string", "description": "City name"},
                                              "unit": {"type": "string", "enum": ["c", "f"]}},
                               "required": ["city"]}}},
  {"type":"function","function":{"name":"convert","description":"Converts an amount (temp\u00e9rature, \u20ac)",
   "parameters":{"type":"object","properties":{"amount":{"type":"number","description":"How much"},
   "precise":{"type":"boolean","default":false},"places":{"type":"integer","default":2}},
   "required":["amount"]}}}
]'''

CONVS = {
    "user": [{"role": "user", "content": "What is the weather in Paris?"}],
    "system_user": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Convert 3 euros."},
    ],
}


def main():
    tools = json.loads(TOOLS_JSON)
    cases = []
    for path in sorted(glob.glob(os.path.join(DIR, "*.jinja"))):
        text = open(path, encoding="utf-8").read()
        if "tools" not in text:
            continue
        name = os.path.basename(path)
        for conv_name, conv in CONVS.items():
            out = render_jinja(Jinja2ChatFormatter, text, conv, True, "<s>", "</s>", tools)
            cases.append({"source": name, "conv": conv_name, "bos_token": "<s>",
                          "eos_token": "</s>", "out": out})
    doc = {"tools_json": TOOLS_JSON, "convs": CONVS, "cases": cases}
    with open(os.path.join(DIR, "tools-expected.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    ok = sum(1 for c in cases if isinstance(c["out"], str))
    print(f"{len(cases)} cases, {ok} rendered by jinja2")


if __name__ == "__main__":
    main()
