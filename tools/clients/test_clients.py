"""Drive a running dg server with the official `openai` and `anthropic` Python packages.

    python tools/clients/test_clients.py --base-url http://127.0.0.1:8080

The server should serve a checkpoint with a chat template and a vision tower (the
tests/fixtures/models/tiny-vision fixture: run_clients.sh starts one). Its output is noise; what
is checked is the protocol: shapes, streaming, usage, stop strings, images, errors as SDK
exceptions. Prints one line per check and `N passed, M failed`; exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import base64
import sys
import traceback
from pathlib import Path

import anthropic
import openai

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "tests" / "fixtures" / "images"

CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


class Ctx:
    def __init__(self, base_url: str, max_body_bytes: int):
        self.base_url = base_url.rstrip("/")
        # No retries: a 429 or 5xx must show, not be retried away.
        self.oa = openai.OpenAI(base_url=self.base_url + "/v1", api_key="unused", max_retries=0)
        self.an = anthropic.Anthropic(base_url=self.base_url, api_key="unused", max_retries=0)
        self.max_body_bytes = max_body_bytes
        self.model = self.oa.models.list().data[0].id


def user(text):
    return [{"role": "user", "content": text}]


def data_url(name: str) -> str:
    return "data:image/png;base64," + base64.b64encode((IMAGES / name).read_bytes()).decode()


@check
def models_list(c: Ctx):
    models = c.oa.models.list()
    assert len(models.data) == 1 and models.data[0].object == "model", models
    assert c.oa.models.retrieve(c.model).id == c.model
    listed = c.an.models.list()
    assert [m.id for m in listed.data] == [c.model], listed


@check
def chat(c: Ctx):
    r = c.oa.chat.completions.create(
        model=c.model, messages=user("Why is the sky blue?"), max_tokens=24, seed=1
    )
    choice = r.choices[0]
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length"), choice.finish_reason
    u = r.usage
    assert u.prompt_tokens > 0 and 0 < u.completion_tokens <= 24, u
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    # max_completion_tokens is the same limit.
    r2 = c.oa.chat.completions.create(
        model=c.model, messages=user("Why is the sky blue?"), max_completion_tokens=24, seed=1
    )
    assert r2.choices[0].message.content == choice.message.content


@check
def chat_stream_with_usage(c: Ctx):
    kwargs = dict(model=c.model, messages=user("Tell me about rivers."), max_tokens=40, seed=2)
    whole = c.oa.chat.completions.create(**kwargs)
    chunks = list(
        c.oa.chat.completions.create(
            **kwargs, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content, (text, whole.choices[0].message.content)
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason], finishes
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    # Without include_usage: no usage chunk.
    plain = list(c.oa.chat.completions.create(**kwargs, stream=True))
    assert all(ch.choices for ch in plain) and all(ch.usage is None for ch in plain)


@check
def diffusion_options_and_drafts(c: Ctx):
    kwargs = dict(model=c.model, messages=user("Count to five."), max_tokens=32, seed=3)
    extra = {"sampler": "entropy-bound", "entropy_bound": 0.2, "steps": 12}
    whole = c.oa.chat.completions.create(**kwargs, extra_body=extra)
    # Drafts come as SSE comments: the SDK never sees them, the text is the same.
    stream = c.oa.chat.completions.create(
        **kwargs, stream=True, extra_body={**extra, "drafts": True}
    )
    text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    assert text == whole.choices[0].message.content
    # mlx-vlm's names for the same options.
    same = c.oa.chat.completions.create(
        **kwargs,
        extra_body={"diffusion_sampler": "entropy-bound", "entropy_bound": 0.2, "max_denoising_steps": 12},
    )
    assert same.choices[0].message.content == whole.choices[0].message.content


@check
def logprobs(c: Ctx):
    kwargs = dict(model=c.model, messages=user("Why is the sky blue?"), max_tokens=24, seed=6,
                  temperature=0.7)
    r = c.oa.chat.completions.create(**kwargs, logprobs=True)
    content = r.choices[0].logprobs.content
    assert content and all(t.logprob <= 0.0 and t.top_logprobs == [] for t in content), content
    assert len(content) == r.usage.completion_tokens or len(content) == r.usage.completion_tokens - 1
    chunks = list(c.oa.chat.completions.create(**kwargs, logprobs=True, stream=True))
    streamed = [t for ch in chunks if ch.choices and ch.choices[0].logprobs
                for t in ch.choices[0].logprobs.content]
    assert [t.logprob for t in streamed] == [t.logprob for t in content]
    assert c.oa.chat.completions.create(**kwargs).choices[0].logprobs is None
    done = c.oa.completions.create(model=c.model, prompt="Once upon a time", max_tokens=16,
                                   seed=1, logprobs=0)
    lp = done.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) > 0, lp


@check
def completions(c: Ctx):
    kwargs = dict(model=c.model, prompt="Once upon a time", max_tokens=24, seed=4)
    r = c.oa.completions.create(**kwargs)
    assert r.object == "text_completion" and isinstance(r.choices[0].text, str)
    assert r.usage.completion_tokens > 0
    chunks = list(
        c.oa.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
    )
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == r.choices[0].text
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens


@check
def stop_strings(c: Ctx):
    kwargs = dict(model=c.model, messages=user("Why is the sky blue?"), max_tokens=40, seed=5)
    full = c.oa.chat.completions.create(**kwargs).choices[0].message.content
    if len(full) < 10:
        print("    (answer too short to cut; skipped)")
        return
    stop = full[6:9]
    cut = full[: full.index(stop)]
    r = c.oa.chat.completions.create(**kwargs, stop=[stop])
    assert r.choices[0].message.content == cut and r.choices[0].finish_reason == "stop"
    streamed = "".join(
        ch.choices[0].delta.content or ""
        for ch in c.oa.chat.completions.create(**kwargs, stop=stop, stream=True)
        if ch.choices
    )
    assert streamed == cut
    m = c.an.messages.create(
        model=c.model, max_tokens=40, messages=user("Why is the sky blue?"), stop_sequences=[stop]
    )
    afull = c.an.messages.create(model=c.model, max_tokens=40, messages=user("Why is the sky blue?"))
    atext = afull.content[0].text
    if stop in atext:
        assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop, m
        assert m.content[0].text == atext[: atext.index(stop)]


@check
def images_openai_and_anthropic(c: Ctx):
    question = "What is in this picture?"
    r = c.oa.chat.completions.create(
        model=c.model,
        max_tokens=16,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": data_url("normal.png")}},
                    {"type": "text", "text": question},
                ],
            }
        ],
    )
    text = r.choices[0].message.content
    assert isinstance(text, str) and r.usage.prompt_tokens > 20, r.usage
    m = c.an.messages.create(
        model=c.model,
        max_tokens=16,
        messages=[
            {
                "role": "user",
                "content": [
                    {
                        "type": "image",
                        "source": {
                            "type": "base64",
                            "media_type": "image/png",
                            "data": base64.b64encode((IMAGES / "normal.png").read_bytes()).decode(),
                        },
                    },
                    {"type": "text", "text": question},
                ],
            }
        ],
    )
    assert m.content[0].text == text, (m.content[0].text, text)
    assert m.usage.input_tokens == r.usage.prompt_tokens
    # Two images, in order.
    two = c.oa.chat.completions.create(
        model=c.model,
        max_tokens=8,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": data_url("pair_a.png")}},
                    {"type": "image_url", "image_url": {"url": data_url("pair_b.png")}},
                    {"type": "text", "text": "Which differs?"},
                ],
            }
        ],
    )
    assert two.usage.prompt_tokens > r.usage.prompt_tokens


@check
def anthropic_messages(c: Ctx):
    kwargs = dict(
        model=c.model,
        max_tokens=32,
        system="You are terse.",
        messages=user("Describe the sea."),
    )
    m = c.an.messages.create(**kwargs)
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert m.stop_reason in ("end_turn", "max_tokens"), m.stop_reason
    assert m.usage.input_tokens > 0 and 0 < m.usage.output_tokens <= 32
    with c.an.messages.stream(**kwargs) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == m.content[0].text, (text, m.content[0].text)
    assert final.stop_reason == m.stop_reason
    assert final.usage.output_tokens == m.usage.output_tokens
    assert final.usage.input_tokens == m.usage.input_tokens
    # The same conversation through the OpenAI route gives the same text.
    r = c.oa.chat.completions.create(
        model=c.model,
        max_tokens=32,
        messages=[{"role": "system", "content": "You are terse."}] + user("Describe the sea."),
    )
    assert r.choices[0].message.content == text
    # The raw event sequence, as the SDK sees it.
    kinds = [e.type for e in c.an.messages.create(**kwargs, stream=True)]
    assert kinds[:2] == ["message_start", "content_block_start"], kinds
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"], kinds
    assert set(kinds[2:-3]) <= {"content_block_delta"}, kinds


def expect(exc_type, fn, status):
    try:
        fn()
    except exc_type as e:
        assert e.status_code == status, (e.status_code, status, e)
        return e
    raise AssertionError(f"no {exc_type.__name__}")


@check
def openai_errors(c: Ctx):
    e = expect(
        openai.BadRequestError,
        lambda: c.oa.chat.completions.create(model=c.model, messages=user("x"), max_tokens=0),
        400,
    )
    assert e.body["param"] == "max_tokens", e.body
    e = expect(
        openai.BadRequestError,
        lambda: c.oa.chat.completions.create(
            model=c.model, messages=user("x"), max_tokens=4, extra_body={"sampler": "magic"}
        ),
        400,
    )
    assert e.body["param"] == "sampler", e.body
    e = expect(
        openai.BadRequestError,
        lambda: c.oa.chat.completions.create(
            model=c.model,
            max_tokens=4,
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}],
                }
            ],
        ),
        400,
    )
    assert "fetches nothing" in e.body["message"], e.body
    expect(
        openai.BadRequestError,
        lambda: c.oa.chat.completions.create(
            model=c.model,
            max_tokens=4,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": data_url("truncated.png")}},
                        {"type": "text", "text": "?"},
                    ],
                }
            ],
        ),
        400,
    )
    expect(
        openai.APIStatusError,
        lambda: c.oa.chat.completions.create(
            model=c.model, messages=user("x" * (c.max_body_bytes + 1000)), max_tokens=4
        ),
        413,
    )
    expect(
        openai.NotFoundError,
        lambda: c.oa.models.retrieve("no-such-model"),
        404,
    )


@check
def anthropic_errors(c: Ctx):
    e = expect(
        anthropic.BadRequestError,
        lambda: c.an.messages.create(
            model=c.model, max_tokens=4, messages=user("x"), extra_body={"temperature": -1}
        ),
        400,
    )
    assert e.body["type"] == "error" and e.body["error"]["type"] == "invalid_request_error", e.body
    expect(
        anthropic.BadRequestError,
        lambda: c.an.messages.create(
            model=c.model,
            max_tokens=4,
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}],
                }
            ],
        ),
        400,
    )
    expect(
        anthropic.APIStatusError,
        lambda: c.an.messages.create(
            model=c.model, max_tokens=4, messages=user("x" * (c.max_body_bytes + 1000))
        ),
        413,
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", required=True)
    p.add_argument("--max-body-bytes", type=int, default=1_000_000, help="the server's --max-body-bytes")
    args = p.parse_args()
    c = Ctx(args.base_url, args.max_body_bytes)
    print(f"openai {openai.__version__}, anthropic {anthropic.__version__}, model {c.model!r} at {c.base_url}")
    passed = failed = 0
    for fn in CHECKS:
        try:
            fn(c)
            print(f"ok      {fn.__name__}")
            passed += 1
        except Exception:
            print(f"FAILED  {fn.__name__}")
            traceback.print_exc()
            failed += 1
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
