#!/usr/bin/env python3
"""Renders every chat template in tests/data/chat_templates/ with Python's jinja2, configured as Hugging Face's
transformers renders chat templates (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loop controls, its
tojson filter, raise_exception and strftime_now), on a fixed set of conversations; writes
tests/data/chat_templates/refs.json, which daemon/jinja_test.cpp compares inferd's engine with.

Each case records the context (messages, tools, bos/eos tokens, add_generation_prompt) and either the rendered
text or the error the template raised. strftime_now() sees a fixed time (NOW, UTC) so the files are stable.

Usage: python3 tools/reference/gen_chat_template_refs.py   (needs jinja2; `pip install jinja2`)
"""
import datetime
import glob
import json
import os

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIR = os.path.join(ROOT, "tests", "data", "chat_templates")
NOW = 1764115200  # 2025-11-26 00:00:00 UTC

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}]

CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hello!"}],
    "system_user": [{"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": "What is the capital of France?"}],
    "multi_turn": [{"role": "system", "content": "Be brief."},
                   {"role": "user", "content": "Hi there"},
                   {"role": "assistant", "content": "Hello! How can I help?"},
                   {"role": "user", "content": "Tell me a joke about \"quotes\" and 'apostrophes'.\nTwo lines, é ü 日本."}],
    "assistant_last": [{"role": "user", "content": "Count to three."},
                       {"role": "assistant", "content": "One, two, three."}],
    "tool_call": [{"role": "user", "content": "What's the weather in Paris?"},
                  {"role": "assistant", "content": "", "tool_calls": [
                      {"id": "call_1", "type": "function",
                       "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
                  {"role": "tool", "name": "get_weather", "tool_call_id": "call_1", "content": "{\"temp\": 18}"},
                  {"role": "user", "content": "Thanks."}],
    "thinking": [{"role": "user", "content": "2+2?"},
                 {"role": "assistant", "content": "<think>\nSimple sum.\n</think>\n\n4"},
                 {"role": "user", "content": "And 3+3?"}],
}


def environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.fromtimestamp(NOW, datetime.timezone.utc).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    env = environment()
    cases = []
    for path in sorted(glob.glob(os.path.join(DIR, "*.jinja"))):
        name = os.path.basename(path)
        with open(path, encoding="utf-8") as f:
            source = f.read()
        template = env.from_string(source)
        for conv, messages in CONVERSATIONS.items():
            for with_tools in (False, True):
                if with_tools and conv not in ("user", "tool_call"):
                    continue
                for gen in (True, False):
                    if not gen and conv not in ("assistant_last", "multi_turn"):
                        continue
                    context = {"messages": messages, "bos_token": "<BOS>", "eos_token": "<EOS>",
                               "add_generation_prompt": gen}
                    if with_tools:
                        context["tools"] = TOOLS
                    case = {"template": name, "conversation": conv, "context": context}
                    try:
                        case["output"] = template.render(**json.loads(json.dumps(context)))
                    except Exception as e:  # noqa: BLE001 - the template's own refusal is a reference too
                        case["error"] = f"{type(e).__name__}: {e}"
                    cases.append(case)
    out = {"source": f"jinja2 {jinja2.__version__} as transformers configures it (tools/reference/gen_chat_template_refs.py)",
           "now": NOW, "cases": cases}
    path = os.path.join(DIR, "refs.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_err = sum(1 for c in cases if "error" in c)
    print(f"wrote {path}: {len(cases)} cases ({n_err} raise an error)")


if __name__ == "__main__":
    main()
