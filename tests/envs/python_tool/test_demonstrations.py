"""python_tool's scripted demonstrations (the warm-up's transcripts) and the warm-up's cache key.

The env writes chat messages; rendered by the trainer, they must be token for token the transcripts
the cached warm-up of the CPU default was trained on, so that it stays valid: the reference below is
the digest of those transcripts.
"""

from __future__ import annotations

import hashlib
import json
import random

import pytest

from agentenv.configio import to_dict
from agentenv.core import Demonstration, Env, has_scripted_demonstrations
from agentenv.envs.python_tool import PythonToolEnv
from agentenv.envs.python_tool.demonstrations import scripted_problem
from agentenv.models import chat_template
from agentenv.rollout.chat import ChatRenderer
from agentenv.trainer import setup
from agentenv.trainer.demonstrations import render_demonstration
from agentenv.trainer.recipe import parse_args
from tests.smollm_tokenizer import smollm_tokenizer

# -- the reference: the transcripts the cached warm-up was trained on -----------------------------
# SHA-256 of ``json.dumps([[ids, mask], ...])`` of the transcripts that ``trainer/warmup.py`` at commit
# 02de162 wrote (``scripted_problem`` + ``build_transcript`` with ``random.Random(seed)``, python_tool's
# system prompt and tool schema, tool results with 4000 characters kept), SmolLM2 tokenizer and the
# tool-aware chat template; computed from that commit's code on 2026-12-01.
REFERENCE_SHA256 = {
    (320, 0): "16debf5e462f67e4f70df6dc4cc6eb2821f6bab2fb72e6f47ef311de5445e2f9",
    (3, 1): "88c48882ded5a311394611d68a7c0fa9ba1516b624406190a3d7473000588a42",
}


def _rendered(renderer, tok, *, count: int, seed: int) -> list[tuple[list[int], list[int]]]:
    encode = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    return [render_demonstration(renderer, encode, d)
            for d in PythonToolEnv.scripted_demonstrations(count=count, seed=seed)]


def _digest(demos) -> str:
    return hashlib.sha256(json.dumps([[list(ids), list(mask)] for ids, mask in demos]).encode()).hexdigest()


# -- the tests ---------------------------------------------------------------------------------------
def test_demonstrations_are_the_transcripts_the_warm_up_always_trained_on():
    tok = smollm_tokenizer()
    renderer = ChatRenderer(tok, chat_template())
    demos = _rendered(renderer, tok, count=320, seed=0)
    assert len(demos) == 320 and _digest(demos) == REFERENCE_SHA256[(320, 0)]
    ids, mask = demos[0]
    assert len(ids) == len(mask) > 100 and 0 < sum(mask) < len(mask) and set(mask) == {0, 1}
    assert renderer.stop_token_ids[0] in ids
    assert tok.decode([i for i, m in zip(ids, mask, strict=True) if m]).count("<tool_call>") == 1
    other = _rendered(renderer, tok, count=3, seed=1)
    assert _digest(other) == REFERENCE_SHA256[(3, 1)] and other != demos[:3]


def test_the_env_writes_chat_messages_without_token_ids():
    demo, = PythonToolEnv.scripted_demonstrations(count=1, seed=0)
    assert demo.system == PythonToolEnv.system_prompt and demo.tools == tuple(PythonToolEnv.tools)
    assert [m["role"] for m in demo.messages] == ["user", "assistant", "tool", "assistant"]
    task, call, result, answer = demo.messages
    solution = scripted_problem(random.Random(0))  # the same seed: the same problem
    assert task["content"] == solution.problem
    python_call = {"name": "python", "arguments": {"code": solution.code}}
    assert call["tool_calls"] == [{"type": "function", "function": python_call}]
    assert solution.answer in result["content"] and "content" not in call
    assert answer["content"] == f"The code prints {solution.answer}, so the answer is $\\boxed{{{solution.answer}}}$."


def test_a_demonstration_refuses_messages_it_cannot_render():
    task = {"role": "user", "content": "Compute $1+1$."}
    with pytest.raises(ValueError, match="first message must be the task"):
        Demonstration(messages=({"role": "assistant", "content": "2"},))
    with pytest.raises(ValueError, match="assistant message needs content or tool_calls"):
        Demonstration(messages=(task, {"role": "assistant"}))
    with pytest.raises(ValueError, match="observation needs"):
        Demonstration(messages=(task, {"role": "tool", "content": 2}))
    with pytest.raises(ValueError, match="observation needs"):
        Demonstration(messages=(task, {"role": "system", "content": "late"}))


def test_the_hook_is_declared_by_python_tool_only():
    assert has_scripted_demonstrations(PythonToolEnv)
    assert not has_scripted_demonstrations(Env) and not has_scripted_demonstrations(lambda: None)


#: The warm-up cache key of the CPU default (SmolLM2, Hermes tool calls): the folder its cached warm-up
#: lies in, so it must not change.
CPU_DEFAULT_KEY = "6fcd5ba1fd4e"


def _renderer(template_extra: str = "") -> ChatRenderer:
    """The default tool-aware template; ``template_extra`` (a Jinja comment) adds a family's call marker."""
    return ChatRenderer(smollm_tokenizer(), chat_template() + template_extra)


def test_the_warm_up_cache_key_of_the_cpu_default_is_unchanged():
    cfg, _ = parse_args(["--recipe", "python_tool_cpu"])
    # the warm-up's fixed demonstration count and seed are in the key
    settings = {**to_dict(cfg.warmup), "num_examples": 320, "seed": 0}
    before = hashlib.sha256(json.dumps([cfg.model.name, settings, 3]).encode()).hexdigest()[:12]
    hermes = _renderer()
    assert hermes.tool_parser_name == "hermes"
    assert setup.warmup_cache_key(cfg, hermes) == before == CPU_DEFAULT_KEY

    # an env with its own demonstrations and the default tag gets a key of its own
    class Other(PythonToolEnv):
        demonstrations_tag = None

    import agentenv

    agentenv.register("tests/OtherTool-v0", Other)
    try:
        other, _ = parse_args(["--recipe", "python_tool_cpu", "--env", "tests/OtherTool-v0"])
        assert setup.warmup_cache_key(other, hermes) != before
    finally:
        agentenv.registry.pop("tests/OtherTool-v0")


def test_the_warm_up_cache_key_names_a_tool_call_family_other_than_hermes():
    cfg, _ = parse_args(["--recipe", "python_tool_cpu"])
    renderers = {"mistral": _renderer("{# [TOOL_CALLS] #}"), "llama3_json": _renderer("{# <|python_tag|> #}"),
                 "deepseek": _renderer("{# tool\u2581calls\u2581begin #}"), "qwen3": _renderer("{# <think> #}")}
    assert {name: r.tool_parser_name for name, r in renderers.items()} == {n: n for n in renderers}
    keys = {name: setup.warmup_cache_key(cfg, r) for name, r in renderers.items()}
    # each family's demonstrations write other call text, so each has a key of its own
    assert len(set(keys.values())) == len(keys) and CPU_DEFAULT_KEY not in keys.values()
    expected = [cfg.model.name, {**to_dict(cfg.warmup), "num_examples": 320, "seed": 0}, 3,
                {"tool_call_family": "mistral"}]
    assert keys["mistral"] == hashlib.sha256(json.dumps(expected).encode()).hexdigest()[:12]
    # the family is the only difference: the demonstrations of two families differ in their call text
    (hermes_ids, _), = _rendered(_renderer(), smollm_tokenizer(), count=1, seed=0)
    (mistral_ids, _), = _rendered(renderers["mistral"], smollm_tokenizer(), count=1, seed=0)
    assert hermes_ids != mistral_ids
