#!/usr/bin/env python3
"""Dump goldens for dg-tokenize (tokenizer, chat template, streaming detokenizer, image splice).

Reference: transformers 5.12.1 + jinja2 3.1.6 + tokenizers 0.22.2 as mlx-optiq 0.7.7 drives them.
Run with the reference venv:

    /work/refenv/bin/python tools/reference/dump_tokenize_goldens.py

Writes tests/fixtures/goldens/tokenize.json. Inputs:
- the fixture tokenizer tests/fixtures/models/tiny/{tokenizer.json,tokenizer_config.json}
  (a small Gemma-format BPE with Gemma's special ids; CJK and emoji fall back to byte tokens),
  loaded as the reference loads it: optiq's `load_tokenizer` (AutoTokenizer + the streaming
  detokenizer it picks from tokenizer.json's decoder);
- the real DiffusionGemma chat template, dg-core/assets/chat_template.jinja (see SOURCE.md there),
  passed to `apply_chat_template(chat_template=...)` so the fixture's own template file does not
  matter.

Sections of the output:
- "tokenizer": vocab size, special tokens map, all_special_ids, eos/bos ids.
- "encode": texts -> ids with add_special_tokens true/false; "decode": ids -> text with
  skip_special_tokens true/false.
- "chat": conversations rendered by `apply_chat_template(tokenize=False)` (the exact string) and
  encoded with `encode(text, add_special_tokens=False)` (what `tokenize=True` returns; checked),
  or the error Jinja2 raised.
- "image_prompts": the reference's image path (`optiq.vlm.diffusion_gemma.generate.
  _build_image_inputs` with its image preprocessing stubbed to given soft-token counts): ids and
  mm_token_type_ids after expanding each <|image|>.
- "stream": id sequences fed one by one to the reference's streaming detokenizer
  (`make_streaming_detokenizer`): the `last_segment` after each id, the final segment after
  `finalize()`, and the final `text`; plus `tokenizer.decode` of the same ids.
- "jinja": small templates rendered by transformers' own Jinja2 environment
  (`_compile_jinja_template`), covering Python str() of values, tojson, trim, dictsort, string and
  dict methods, tests, whitespace control, and errors.
- "float_repr": Python repr() of floats (what templates print and json.dumps writes).
- "strftime": C strftime (glibc) of fixed UTC instants.
- "gemma_rebuild": a mutation of tokenizer.json (normalizer / pre-tokenizer / decoder removed,
  BPE flags flipped) that GemmaTokenizer must ignore; checked here to tokenize identically.
- "bos_eos_variants": encodings with add_bos_token / add_eos_token set in tokenizer_config.json
  (transformers 5 ignores them when tokenizer.json exists).
"""

import hashlib
import json
import pathlib
import random
import sys
import time
from pathlib import Path

import numpy as np
from transformers.utils.chat_template_utils import _compile_jinja_template

from optiq.vlm._mlxvlm.tokenizer_utils import load_tokenizer, make_streaming_detokenizer

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOKENIZER_DIR = ROOT / "tests" / "fixtures" / "models" / "tiny"
TEMPLATE_PATH = ROOT / "dg-core" / "assets" / "chat_template.jinja"
OUT = ROOT / "tests" / "fixtures" / "goldens" / "tokenize.json"

TEMPLATE = TEMPLATE_PATH.read_text(encoding="utf-8")

# ---------------------------------------------------------------------------------------------
# Conversations
# ---------------------------------------------------------------------------------------------

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Unit"},
                "days": {"type": "integer", "description": "Forecast days", "nullable": True},
            },
            "required": ["city"],
        },
    },
}

SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search_docs",
        "description": "Search the documentation. Returns matching pages.",
        "parameters": {
            "type": "object",
            "properties": {
                # Mixed-case keys: Jinja2's dictsort is case-insensitive.
                "Zeta": {"type": "number", "description": "A weight"},
                "alpha": {"type": "boolean", "description": "Exact match"},
                "Beta": {
                    "type": "array",
                    "description": "Tags",
                    "items": {"type": "string", "enum": ["a", "b"]},
                },
                "filters": {
                    "type": "object",
                    "description": "Filters",
                    "properties": {
                        "lang": {"type": "string", "description": "Language"},
                        "year": {"type": "integer"},
                    },
                    "required": ["lang"],
                },
                "coords": {
                    "type": "array",
                    "items": {"type": ["number", "null"]},
                },
                "untyped": {"description": "No type given"},
            },
            "required": ["Zeta", "filters"],
        },
        "response": {"type": "object", "description": "Search results"},
    },
}

NO_PARAMS_TOOL = {
    "type": "function",
    "function": {"name": "ping", "description": "Check that the service is up."},
}

CHAT_CASES = [
    {"name": "user_only_gen", "messages": [{"role": "user", "content": "Hello there!"}],
     "add_generation_prompt": True},
    {"name": "user_only_nogen", "messages": [{"role": "user", "content": "Hello there!"}],
     "add_generation_prompt": False},
    {"name": "system_user_gen",
     "messages": [{"role": "system", "content": "  You are a helpful assistant.\n"},
                  {"role": "user", "content": "What is 2 + 2?"}],
     "add_generation_prompt": True},
    {"name": "system_user_thinking",
     "messages": [{"role": "system", "content": "Think step by step."},
                  {"role": "user", "content": "Why is the sky blue?"}],
     "add_generation_prompt": True, "enable_thinking": True},
    {"name": "user_thinking_no_system",
     "messages": [{"role": "user", "content": "Why is the sky blue?"}],
     "add_generation_prompt": True, "enable_thinking": True},
    {"name": "user_thinking_false",
     "messages": [{"role": "user", "content": "Why is the sky blue?"}],
     "add_generation_prompt": True, "enable_thinking": False},
    {"name": "developer_role",
     "messages": [{"role": "developer", "content": "Answer briefly."},
                  {"role": "user", "content": "Name a color."}],
     "add_generation_prompt": True},
    {"name": "system_parts",
     "messages": [{"role": "system", "content": [{"type": "text", "text": " Be kind. "},
                                                 {"type": "text", "text": "Be brief."}]},
                  {"role": "user", "content": "Hi"}],
     "add_generation_prompt": True},
    {"name": "multi_turn",
     "messages": [{"role": "user", "content": "Write a haiku about the sea."},
                  {"role": "assistant", "content": "Waves fold into foam,\nsalt wind carries gull voices,\nthe tide keeps its time."},
                  {"role": "user", "content": "Now one about mountains."}],
     "add_generation_prompt": True},
    {"name": "multi_turn_nogen_ends_assistant",
     "messages": [{"role": "user", "content": "Say hi."},
                  {"role": "assistant", "content": "Hi!"}],
     "add_generation_prompt": False},
    {"name": "assistant_with_thought_stripped",
     "messages": [{"role": "user", "content": "2+3?"},
                  {"role": "assistant", "content": "<|channel>thought\nadd them<channel|>It is 5."},
                  {"role": "user", "content": "And 2*3?"}],
     "add_generation_prompt": True, "enable_thinking": True},
    {"name": "consecutive_assistant",
     "messages": [{"role": "user", "content": "Count."},
                  {"role": "assistant", "content": "One,"},
                  {"role": "assistant", "content": "two."}],
     "add_generation_prompt": True},
    {"name": "user_parts_image",
     "messages": [{"role": "user", "content": [{"type": "image"},
                                               {"type": "text", "text": " What is in this picture? "}]}],
     "add_generation_prompt": True},
    {"name": "user_parts_two_images",
     "messages": [{"role": "user", "content": [{"type": "text", "text": "Compare"},
                                               {"type": "image", "url": "a.png"},
                                               {"type": "text", "text": "with"},
                                               {"type": "image", "url": "b.png"}]}],
     "add_generation_prompt": True},
    {"name": "reference_image_prompt",
     "messages": [{"role": "user", "content": "<|image|><|image|>Describe both images."}],
     "add_generation_prompt": True},
    {"name": "tools_declared",
     "messages": [{"role": "user", "content": "Weather in Paris?"}],
     "tools": [WEATHER_TOOL, SEARCH_TOOL, NO_PARAMS_TOOL],
     "add_generation_prompt": True},
    {"name": "tools_with_system_and_thinking",
     "messages": [{"role": "system", "content": "Use tools when useful."},
                  {"role": "user", "content": "Weather in Paris?"}],
     "tools": [WEATHER_TOOL],
     "add_generation_prompt": True, "enable_thinking": True},
    {"name": "tool_call_round_trip",
     "messages": [
         {"role": "user", "content": "Weather in Paris, 3 days?"},
         {"role": "assistant", "tool_calls": [
             {"id": "call_1", "type": "function", "function": {
                 "name": "get_weather",
                 "arguments": {"city": "Paris", "days": 3, "ratio": 2.5, "tiny": 1e-07,
                               "flag": True, "none": None, "tags": ["a", 1, False],
                               "nested": {"k": "v", "Z": 0.1}}}}]},
         {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 18, \"sky\": \"clear\"}"},
     ],
     "tools": [WEATHER_TOOL],
     "add_generation_prompt": True},
    {"name": "tool_call_string_arguments_then_answer",
     "messages": [
         {"role": "user", "content": "Ping it."},
         {"role": "assistant", "content": None, "tool_calls": [
             {"id": "c9", "type": "function", "function": {"name": "ping", "arguments": "{}"}}]},
         {"role": "tool", "tool_call_id": "c9", "name": "ping", "content": [
             {"type": "text", "text": "pong"}, {"type": "image"}]},
         {"role": "assistant", "content": "The service answered pong."},
         {"role": "user", "content": "Thanks"},
     ],
     "tools": [NO_PARAMS_TOOL],
     "add_generation_prompt": True},
    {"name": "tool_call_reasoning_kept",
     "messages": [
         {"role": "user", "content": "Multiply 3 by 4."},
         {"role": "assistant", "reasoning_content": "I should call multiply.", "tool_calls": [
             {"id": "m1", "type": "function", "function": {"name": "multiply", "arguments": {"a": 3, "b": 4}}}]},
         {"role": "tool", "tool_call_id": "m1", "content": "12"},
     ],
     "add_generation_prompt": True, "enable_thinking": True},
    {"name": "tool_call_pending_no_response",
     "messages": [
         {"role": "user", "content": "Multiply 3 by 4."},
         {"role": "assistant", "tool_calls": [
             {"id": "m1", "type": "function", "function": {"name": "multiply", "arguments": {"a": 3, "b": 4}}}]},
     ],
     "add_generation_prompt": True},
    {"name": "legacy_tool_responses",
     "messages": [
         {"role": "user", "content": "Weather?"},
         {"role": "assistant", "tool_calls": [
             {"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}],
          "tool_responses": [{"name": "get_weather", "response": {"temp": -3, "wind": "strong"}},
                             {"name": "get_weather", "response": "no data"}]},
     ],
     "add_generation_prompt": True},
    {"name": "non_ascii",
     "messages": [{"role": "system", "content": "\u3000Réponds en français, s'il te plaît.\x1f"},
                  {"role": "user", "content": "你好，世界！🙂🚀 Привет, мир. Straße, naïve café — ok?\n\n"}],
     "add_generation_prompt": True},
    {"name": "tricky_text",
     "messages": [{"role": "user", "content": "Use {{ braces }} and {% tags %}, 'quotes', \"dq\", back\\slash, <|\"|> and <b>html</b>."}],
     "add_generation_prompt": True},
    {"name": "empty_user_content",
     "messages": [{"role": "user", "content": ""}],
     "add_generation_prompt": True},
    {"name": "preserve_kwarg_ignored",
     "messages": [{"role": "user", "content": "x"}],
     "add_generation_prompt": True, "extra": {"preserve_thinking": True}},
    # Errors in Jinja2 must be errors in Rust too.
    {"name": "error_no_messages", "messages": [], "add_generation_prompt": True},
    {"name": "error_tool_name_none",
     "messages": [
         {"role": "user", "content": "?"},
         {"role": "assistant", "tool_calls": [
             {"id": "a", "type": "function", "function": {"name": "f", "arguments": {}}}]},
         {"role": "tool", "tool_call_id": "zzz", "content": "r"},
     ],
     "add_generation_prompt": True},
]

IMAGE_PROMPT_CASES = [
    {"name": "one_image", "prompt": "What is this?", "soft_tokens": [5]},
    {"name": "two_images", "prompt": "Describe both. 🙂", "soft_tokens": [3, 7]},
    {"name": "zero_tokens", "prompt": "Empty image.", "soft_tokens": [0]},
]

ENCODE_TEXTS = [
    "Hello world!",
    "The quick brown fox jumps over the lazy dog.",
    "  leading and trailing spaces  ",
    "tabs\tand\nnew lines\n\nand  double  spaces",
    "你好，世界。こんにちは",
    "Emoji 🙂🚀🌍✨ and flags 🇫🇷",
    "Café naïve résumé Straße ǅ",
    "<|turn>user\nHi<turn|>\n<|turn>model\n<|channel>thought\n<channel|>",
    "<bos><eos><pad><unk><mask>",
    "<|image><|image|><image|>",
    "unknown < | > <not_a_token>",
    "",
    " ",
    "\u2581already a sentencepiece space",
    "x" * 50,
]

# ---------------------------------------------------------------------------------------------
# Jinja snippets: (name, template, context)
# ---------------------------------------------------------------------------------------------

JINJA_VALUES = {
    "none": None, "true": True, "false": False, "int": 42, "neg": -7, "big": 12345678901234567890,
    "float": 2.5, "tiny": 1e-07, "huge": 1e16, "fifteen": 1e15, "sum": 0.30000000000000004,
    "whole": 3.0, "str": "plain", "apos": "it's", "dq": 'say "hi"', "both": "it's \"x\"",
    "ctrl": "tab\tnl\nbell\x07", "uni": "ünï 你好 🙂", "list": [1, "a", None, True, 2.5],
    "dict": {"k": "v", "n": 1.0, "l": [None]}, "empty_list": [], "empty_dict": {},
}

JINJA_CASES = []
for key in JINJA_VALUES:
    JINJA_CASES.append((f"print_{key}", "{{ x }}", {"x": JINJA_VALUES[key]}))
    JINJA_CASES.append((f"tojson_{key}", "{{ x | tojson }}", {"x": JINJA_VALUES[key]}))

NESTED = {"b": [1, 2, {"z": None, "a": "é"}], "a": {"y": True, "x": []}, "c": {}, "u": "🙂\u2028</script>"}
JINJA_CASES += [
    ("tojson_indent2", "{{ x | tojson(indent=2) }}", {"x": NESTED}),
    ("tojson_indent0", "{{ x | tojson(indent=0) }}", {"x": NESTED}),
    ("tojson_indent_str", "{{ x | tojson(indent='\t') }}", {"x": NESTED}),
    ("tojson_sort_keys", "{{ x | tojson(sort_keys=true) }}", {"x": NESTED}),
    ("tojson_separators", "{{ x | tojson(separators=(',', ':')) }}", {"x": NESTED}),
    ("tojson_ensure_ascii", "{{ x | tojson(ensure_ascii=true) }}", {"x": NESTED}),
    ("tojson_positional_ensure_ascii", "{{ x | tojson(true) }}", {"x": "é🙂"}),
    ("tojson_all", "{{ x | tojson(indent=1, sort_keys=true, separators=(', ', ' = ')) }}", {"x": NESTED}),
    ("trim_python_whitespace", "[{{ x | trim }}]", {"x": "\x1f\u3000 a b \t\n\x1c"}),
    ("trim_chars", "[{{ x | trim('xy') }}]", {"x": "xyaxyb yx"}),
    ("dictsort_case", "{% for k, v in x | dictsort %}{{ k }}={{ v }};{% endfor %}",
     {"x": {"b": 1, "B": 2, "a": 3, "C": 4, "_": 5, "Z": 6}}),
    ("str_split", "{{ s.split(',') }}|{{ s.split(',', 1) }}|{{ t.split() }}", {"s": "a,b,,c", "t": "  x  y\tz "}),
    ("str_strip", "[{{ s.strip() }}][{{ s.lstrip() }}][{{ s.rstrip() }}][{{ s.strip('-') }}]",
     {"s": "\x1f -a- \x1d"}),
    ("str_methods", "{{ s.upper() }} {{ s.lower() }} {{ s.title() }} {{ s.startswith('He') }} "
     "{{ s.endswith('!') }} {{ s.replace('l', 'L') }} {{ s.find('o') }} {{ s.count('l') }}",
     {"s": "Hello wörld!"}),
    ("dict_get", "{{ d.get('a') }}|{{ d.get('missing') }}|{{ d.get('missing', 'dflt') }}|"
     "{{ d.get('missing') | default('unused') }}|{{ d.missing | default('used') }}",
     {"d": {"a": 1}}),
    ("tests", "{% for v in vals %}{{ v is string }}{{ v is sequence }}{{ v is mapping }}"
     "{{ v is iterable }}{{ v is boolean }}{{ v is none }};{% endfor %}",
     {"vals": ["s", [1], {"a": 1}, 3, True, None]}),
    ("defined", "{{ x is defined }}{{ y is defined }}{{ y is undefined }}", {"x": None}),
    ("undefined_print_and_filters", "[{{ y }}][{{ y | upper }}][{{ y | trim }}][{{ y | length }}]", {}),
    ("upper_list", "{{ x | upper }}", {"x": ["a", "b"]}),
    ("map_upper", "{{ x | map('upper') | list }}", {"x": ["a", "b"]}),
    ("range_negative", "{{ range(5, -1, -2) | list }}{{ range(3) | list }}{{ range(2, 2) | list }}", {}),
    ("length", "{{ s | length }} {{ l | length }} {{ d | length }}", {"s": "🙂é", "l": [1, 2], "d": {"a": 1}}),
    ("namespace_loop", "{% set ns = namespace(n=0, s='') %}{% for i in items %}{% set ns.n = ns.n + i %}"
     "{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }} {{ ns.s }}", {"items": [1, 2, 3]}),
    ("if_scope", "{% for i in [1, 2] %}{% set f = false %}{% if i == 2 %}{% set f = true %}{% endif %}"
     "{{ f }};{% endfor %}", {}),
    ("loop_vars", "{% for x in xs %}{{ loop.index0 }}{{ loop.first }}{{ loop.last }} {% endfor %}",
     {"xs": ["a", "b"]}),
    ("set_block", "{% set c %}  inner {{ 1 }}  {% endset %}[{{ c }}][{{ c | trim | length > 0 }}]", {}),
    ("slice", "{{ xs[1:] }} {{ xs[:-1] }} {{ xs[::-1] }} {{ s[1:3] }}", {"xs": [1, 2, 3], "s": "héllo"}),
    ("in_and_concat", "{{ 'a' in 'cat' }} {{ 'k' in d }} {{ 1 in l }} {{ 'x' + 'y' }}",
     {"d": {"k": 1}, "l": [1]}),
    ("whitespace_control",
     "  {% if true %}\n  a\n  {% endif %}\n{# comment #}\n  {%- set y = 1 %}\nb {{ y }}\n  {{- 'c' }}  \n"
     "{% for i in [1,2] %}\n  [{{ i }}]\n{% endfor %}\n  {%+ if true %}d{% endif %}\n", {}),
    ("macro_kwargs", "{% macro f(a, b='B', c=false) %}{{ a }}{{ b }}{{ c }}{% endmacro %}"
     "{{ f(1) }}|{{ f(1, c=true) }}|{{ f('x', 'y') }}", {}),
    ("not_filter_precedence", "{{ not x | default(false) }}{{ not y | default(false) }}", {"x": True}),
    ("string_filter", "{{ x | string }}|{{ n | string }}|{{ b | string }}", {"x": None, "n": 2.5, "b": True}),
    ("join", "{{ l | join }}|{{ l | join(', ') }}|{{ s | join('-') }}|{{ d | join(',', attribute='n') }}",
     {"l": [1, None, True, 2.5, "x"], "s": "abc", "d": [{"n": 1}, {"n": "two"}]}),
    ("tilde_str_int", "{{ 'Image ' ~ n ~ ': ' ~ s }}", {"n": 3, "s": "ok"}),
    ("raise_exception", "{{ raise_exception('Conversation roles must alternate!') }}", {}),
    ("error_undefined_attr", "{{ y.attr }}", {}),
    ("error_undefined_item", "{{ y['k'] }}", {}),
    ("error_str_plus_none", "{{ 'a' + x }}", {"x": None}),
]

FLOATS = [1.0, 0.1, -2.5, 1e16, 1e15, 9999999999999998.0, 0.0001, 0.00001, 1.5e300, -0.0, 0.0,
          123456.789, 1.2345678901234567e-7, 3.14159, 5e-324, 1.7976931348623157e308, 2.0**70,
          0.30000000000000004, 100.0, 1e22, 1e-4, 0.00012345]

STRFTIME_CASES = [
    ("%Y-%m-%d", 1709211909), ("%d %b %Y", 1709211909), ("%d %B %Y", 0),
    ("%A, %B %-d, %Y %I:%M %p", 1709211909), ("%H:%M:%S %j %y %a %e|%%", 1735689599),
    ("%F %T %D %R %u %w", 951782400), ("plain text", 0), ("%Q unknown", 86400 * 365),
]


def render_chat(tok, case):
    kwargs = dict(case.get("extra", {}))
    if "enable_thinking" in case:
        kwargs["enable_thinking"] = case["enable_thinking"]
    return tok.apply_chat_template(
        case["messages"], tools=case.get("tools"), tokenize=False,
        add_generation_prompt=case["add_generation_prompt"], chat_template=TEMPLATE, **kwargs,
    )


def chat_goldens(tok):
    out = []
    for case in CHAT_CASES:
        entry = {k: v for k, v in case.items()}
        try:
            text = render_chat(tok, case)
        except Exception as e:  # noqa: BLE001 - the error itself is the golden
            entry["error"] = f"{type(e).__name__}: {e}"
            out.append(entry)
            continue
        ids = tok.encode(text, add_special_tokens=False)
        kwargs = dict(case.get("extra", {}))
        if "enable_thinking" in case:
            kwargs["enable_thinking"] = case["enable_thinking"]
        ids2 = tok.apply_chat_template(
            case["messages"], tools=case.get("tools"), tokenize=True, return_dict=False,
            add_generation_prompt=case["add_generation_prompt"], chat_template=TEMPLATE, **kwargs,
        )
        ids2 = list(ids2["input_ids"] if isinstance(ids2, dict) or hasattr(ids2, "keys") else ids2)
        assert ids2 == ids, (case["name"], ids2, ids)
        entry["rendered"] = text
        entry["ids"] = ids
        out.append(entry)
    return out


def image_prompt_goldens(tok, config):
    import importlib

    import optiq.vlm.gemma4.image_processing as ip

    gen = importlib.import_module("optiq.vlm.diffusion_gemma.generate")

    class FakeModel:
        _optiq_config = config

    out = []
    real = ip.preprocess_images
    try:
        for case in IMAGE_PROMPT_CASES:
            soft = case["soft_tokens"]
            ip.preprocess_images = lambda images, _soft=soft: (
                [np.zeros((3, 2, 2), np.float32) for _ in images], list(_soft))
            images = [object()] * len(soft)
            input_ids, _pv, mm = gen._build_image_inputs(FakeModel(), tok, case["prompt"], images)
            text = tok.apply_chat_template(
                [{"role": "user", "content": "<|image|>" * len(images) + case["prompt"]}],
                tokenize=False, add_generation_prompt=True)
            out.append({
                **case,
                "rendered": text,
                "raw_ids": tok.encode(text, add_special_tokens=False),
                "ids": [int(x) for x in np.array(input_ids)[0].tolist()],
                "token_types": [int(x) for x in np.array(mm)[0].tolist()],
            })
    finally:
        ip.preprocess_images = real
    return out


def stream_run(tok, ids):
    det = make_streaming_detokenizer(tok)
    segments = []
    for t in ids:
        det.add_token(t, skip_special_token_ids=set())
        segments.append(det.last_segment)
    det.finalize()
    final = det.last_segment
    return {"ids": ids, "segments": segments, "final_segment": final, "text": det.text,
            "decode": tok.decode(ids, skip_special_tokens=False)}


def stream_goldens(tok):
    vocab = tok.get_vocab()
    byte_id = {int(k[3:5], 16): v for k, v in vocab.items()
               if k.startswith("<0x") and len(k) == 6 and k[5] == ">"}
    sp = vocab["\u2581"] if "\u2581" in vocab else None

    def bytes_of(s):
        return [byte_id[b] for b in s.encode("utf-8")]

    seqs = {}
    for text in ["Hello world!", "你好，世界。", "Emoji 🙂🚀 mixed with text 🌍 end",
                 "Café — naïve ✨\nnew line", "<|turn>model\n<|channel>thought\n<channel|>Answer: 42"]:
        seqs["encode:" + text] = tok.encode(text, add_special_tokens=False)
    hello = tok.encode("Hello", add_special_tokens=False)
    world = tok.encode(" world", add_special_tokens=False)
    emoji = bytes_of("🙂")
    seqs["emoji_bytes_then_word"] = hello + emoji + world
    seqs["emoji_split_by_word"] = hello + emoji[:2] + world + emoji[2:] + world
    seqs["cjk_incomplete_at_end"] = hello + world + bytes_of("你")[:2]
    seqs["incomplete_then_special"] = hello + bytes_of("é")[:1] + [vocab["<|channel>"]] + world
    seqs["lone_continuation_bytes"] = world + [byte_id[0x80], byte_id[0xBF]] + world
    seqs["ends_in_replacement_char"] = world + bytes_of("\ufffd")
    seqs["starts_with_bytes"] = bytes_of("🚀") + world
    if sp is not None:
        seqs["bare_spaces"] = [sp, sp] + hello + [sp]
    seqs["specials_mixed"] = [vocab["<bos>"]] + hello + [vocab["<|image|>"], vocab["<turn|>"]] + world
    rng = random.Random(1234)
    all_ids = list(range(len(vocab)))
    byte_ids = sorted(byte_id.values())  # get_vocab() order varies between runs
    for i in range(6):
        n = rng.randint(5, 40)
        seqs[f"random_{i}"] = [rng.choice(byte_ids) if rng.random() < 0.5 else rng.choice(all_ids)
                               for _ in range(n)]
    return [{"name": k, **stream_run(tok, v)} for k, v in seqs.items()]


def jinja_goldens():
    out = []
    for name, src, ctx in JINJA_CASES:
        entry = {"name": name, "template": src, "context": ctx}
        try:
            entry["rendered"] = _compile_jinja_template(src).render(**ctx)
        except Exception as e:  # noqa: BLE001
            entry["error"] = f"{type(e).__name__}: {e}"
        out.append(entry)
    return out


def main():
    tok = load_tokenizer(Path(TOKENIZER_DIR))
    # The reference renders with the checkpoint's template; give the fixture the real one.
    tok._tokenizer.chat_template = TEMPLATE
    detok_class = type(tok.detokenizer).__name__
    trim = getattr(tok.detokenizer, "trim_space", None)
    config = json.loads((TOKENIZER_DIR / "config.json").read_text())

    encode = []
    for text in ENCODE_TEXTS:
        encode.append({"text": text,
                       "ids_special": tok.encode(text, add_special_tokens=True),
                       "ids_plain": tok.encode(text, add_special_tokens=False)})
    decode = []
    for e in encode:
        ids = e["ids_plain"]
        decode.append({"ids": ids, "text": tok.decode(ids, skip_special_tokens=False),
                       "text_skip_special": tok.decode(ids, skip_special_tokens=True)})

    # Sanity: the pure tokenizers object reading tokenizer.json agrees with transformers here.
    from tokenizers import Tokenizer as RawTokenizer
    raw = RawTokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json"))
    for e in encode:
        assert raw.encode(e["text"], add_special_tokens=False).ids == e["ids_plain"], e["text"]

    # GemmaTokenizer rebuilds normalizer / pre-tokenizer / decoder / BPE options from code and
    # ignores the file's: a tokenizer.json stripped of them must tokenize the same.
    gemma_rebuild = {"remove": ["normalizer", "pre_tokenizer", "decoder"],
                     "model": {"byte_fallback": False, "fuse_unk": False}}
    import shutil
    import tempfile

    from transformers import AutoTokenizer
    with tempfile.TemporaryDirectory() as tmp:
        tj = json.loads((TOKENIZER_DIR / "tokenizer.json").read_text(encoding="utf-8"))
        for k in gemma_rebuild["remove"]:
            tj[k] = None
        tj["model"].update(gemma_rebuild["model"])
        Path(tmp, "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False), encoding="utf-8")
        shutil.copy(TOKENIZER_DIR / "tokenizer_config.json", Path(tmp, "tokenizer_config.json"))
        variant = AutoTokenizer.from_pretrained(tmp)
        for e, d in zip(encode, decode):
            assert variant.encode(e["text"], add_special_tokens=False) == e["ids_plain"], e["text"]
            assert variant.decode(d["ids"]) == d["text"], d["ids"]

    # add_bos_token / add_eos_token in tokenizer_config.json rebuild the post-processor.
    bos_eos = []
    for patch in [{"add_bos_token": True}, {"add_bos_token": True, "add_eos_token": True},
                  {"add_eos_token": True}]:
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(TOKENIZER_DIR / "tokenizer.json", Path(tmp, "tokenizer.json"))
            cfg = json.loads((TOKENIZER_DIR / "tokenizer_config.json").read_text(encoding="utf-8"))
            cfg.update(patch)
            Path(tmp, "tokenizer_config.json").write_text(json.dumps(cfg), encoding="utf-8")
            variant = AutoTokenizer.from_pretrained(tmp)
            bos_eos.append({"config_patch": patch, "encode": [
                {"text": t, "ids_special": variant.encode(t, add_special_tokens=True),
                 "ids_plain": variant.encode(t, add_special_tokens=False)}
                for t in ["Hello", "", "<bos>x"]]})

    data = {
        "about": "Generated by tools/reference/dump_tokenize_goldens.py; do not edit.",
        "tokenizer_dir": str(TOKENIZER_DIR.relative_to(ROOT)),
        "tokenizer_json_sha256": hashlib.sha256((TOKENIZER_DIR / "tokenizer.json").read_bytes()).hexdigest(),
        "chat_template": str(TEMPLATE_PATH.relative_to(ROOT)),
        "chat_template_sha256": hashlib.sha256(TEMPLATE.encode("utf-8")).hexdigest(),
        "tokenizer": {
            "vocab_size": len(tok._tokenizer),
            "special_tokens_map": tok.special_tokens_map,
            "all_special_ids": tok.all_special_ids,
            "eos_token_id": tok.eos_token_id,
            "bos_token_id": tok.bos_token_id,
            "config_eos_token_id": config["eos_token_id"],
            "image_token_ids": {"image": config["image_token_id"], "boi": config["boi_token_id"],
                                "eoi": config["eoi_token_id"]},
            "detokenizer": detok_class,
            "detokenizer_trim_space": trim,
        },
        "gemma_rebuild": gemma_rebuild,
        "bos_eos_variants": bos_eos,
        "encode": encode,
        "decode": decode,
        "chat": chat_goldens(tok),
        "image_prompts": image_prompt_goldens(tok, config),
        "stream": stream_goldens(tok),
        "jinja": jinja_goldens(),
        "float_repr": [{"value": x, "repr": repr(x)} for x in FLOATS],
        "strftime": [{"format": f, "unix": t, "text": time.strftime(f, time.gmtime(t))}
                     for f, t in STRFTIME_CASES],
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    n_err = sum("error" in c for c in data["chat"])
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes): {len(data['chat'])} chat cases "
          f"({n_err} errors), {len(data['stream'])} stream cases, {len(data['jinja'])} jinja cases",
          file=sys.stderr)


if __name__ == "__main__":
    main()
