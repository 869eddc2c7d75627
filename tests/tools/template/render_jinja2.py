#!/usr/bin/env python3
"""Renders the chat-template fixtures with Python's Jinja2 set up as transformers sets it up.

A second reference besides @huggingface/jinja (render_expected.mjs): where the two disagree, the
C++ renderer follows one of them on purpose, and tests/fixtures/text/template/deviations.json
says which and why. Needs Jinja2 (Debian: python3-jinja2). Run after render_expected.mjs:

    python3 render_jinja2.py

Writes tests/fixtures/text/template/expected/jinja2/<name>.json in the same layout.
"""
import json
from datetime import datetime
from pathlib import Path

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
FIXTURES = REPO / "tests/fixtures/text/template"
SPECIAL = ["bos_token", "eos_token", "unk_token", "pad_token"]
TEMPLATES = {
    "qwen3": FIXTURES / "qwen3/tokenizer_config.json",
    "llama3": FIXTURES / "llama3/tokenizer_config.json",
    "deepseek_v3": FIXTURES / "deepseek_v3/tokenizer_config.json",
    "gemma3": FIXTURES / "gemma3/tokenizer_config.json",
    "qwen3_moe_tiny": REPO / "tests/fixtures/hf/realvocab/qwen3_moe_tiny/tokenizer_config.json",
}


class Raised(jinja2.exceptions.TemplateError):
    pass


def raise_exception(message):
    raise Raised(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers replaces Jinja2's tojson (which HTML-escapes) with plain json.dumps.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def special_tokens(config):
    out = {}
    for key in SPECIAL:
        v = config.get(key)
        if v is None:
            continue
        out[key] = v if isinstance(v, str) else v["content"]
    return out


def main():
    env = make_env()
    conversations = sorted((FIXTURES / "conversations").glob("*.json"))
    for name, path in TEMPLATES.items():
        config = json.loads(path.read_text(encoding="utf-8"))
        template = env.from_string(config["chat_template"])
        cases = []
        for conv_path in conversations:
            conv = json.loads(conv_path.read_text(encoding="utf-8"))
            for agp in (False, True):
                context = dict(messages=conv["messages"], tools=conv.get("tools"), documents=None,
                               add_generation_prompt=agp, **special_tokens(config),
                               **conv.get("extra", {}))
                entry = {"conversation": conv_path.stem, "add_generation_prompt": agp}
                try:
                    entry["rendered"] = template.render(**context)
                except Raised as e:
                    entry["error"], entry["raised"] = str(e), True
                except Exception as e:  # noqa: BLE001 - any renderer error is a recorded outcome
                    entry["error"], entry["raised"] = f"{type(e).__name__}: {e}", False
                cases.append(entry)
        out = FIXTURES / "expected/jinja2" / f"{name}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        payload = {"renderer": f"Jinja2 {jinja2.__version__} with transformers' settings",
                   "template": str(path.relative_to(REPO)), "cases": cases}
        out.write_text(json.dumps(payload, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
        errors = sum("error" in c for c in cases)
        print(f"{name}: {len(cases)} cases, {errors} errors")

    features = json.loads((FIXTURES / "features.json").read_text(encoding="utf-8"))
    results = {}
    for name, source in features["templates"].items():
        entry = {}
        try:
            entry["rendered"] = env.from_string(source).render(**features["context"])
        except Raised as e:
            entry["error"], entry["raised"] = str(e), True
        except Exception as e:  # noqa: BLE001
            entry["error"], entry["raised"] = f"{type(e).__name__}: {e}", False
        results[name] = entry
    out = FIXTURES / "expected/jinja2/features.json"
    payload = {"renderer": f"Jinja2 {jinja2.__version__} with transformers' settings",
               "results": results}
    out.write_text(json.dumps(payload, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    print(f"features: {len(results)} templates")


if __name__ == "__main__":
    main()
