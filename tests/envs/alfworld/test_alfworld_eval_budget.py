"""A 50-step ALFWorld game under ``agentenv eval``'s default budgets, with the default model's renderer.

The evaluation's episode budget is the model's context (``max_total_tokens`` = the engine's
``max_context_tokens``; SmolLM2-135M: 8,192 tokens). An ALFWorld turn costs about 140 tokens of
observation and chat markup besides the reply, so a game of one-command replies plays all 50 steps
(the game's own limit ends it), and a game whose replies carry a sentence of reasoning runs out of
context at about step 49. These tests play real games with scripted replies through the real chat
template and ``evaluation.model_agent``.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("alfworld", reason="the alfworld package is not installed (scripts/install_alfworld.sh)")

from agentenv.engines.base import GenerationOutput, TokenSpan  # noqa: E402
from agentenv.eval_command import DEFAULT_MAX_STEPS, EvalArgs  # noqa: E402
from agentenv.evaluation import make_jobs, model_agent  # noqa: E402
from agentenv.registration import make  # noqa: E402
from agentenv.rollout.chat import ChatRenderer  # noqa: E402
from agentenv.rollout.episode import RolloutConfig  # noqa: E402

pytestmark = pytest.mark.alfworld

#: SmolLM2-135M-Instruct's context (its config's max_position_embeddings), the eval budget of the default model.
DEFAULT_MODEL_CONTEXT = 8192


class RepeatingEngine:
    """Answers every turn with the same reply text, tokenized by the real tokenizer; records prompt lengths."""

    version = 0
    max_context_tokens = DEFAULT_MODEL_CONTEXT

    def __init__(self, tokenizer, renderer: ChatRenderer, reply: str) -> None:
        self.reply = tokenizer.encode(reply, add_special_tokens=False) + [renderer.stop_token_ids[0]]
        self.prompt_lengths: list[int] = []

    async def generate(self, prompt_ids, params) -> GenerationOutput:
        self.prompt_lengths.append(len(prompt_ids))
        ids = self.reply[: params.max_new_tokens]
        return GenerationOutput(ids, [-0.1] * len(ids), [TokenSpan(len(ids), 0, 0)], "stop")

    async def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from agentenv.models import chat_template, resolve_model_path

    path = resolve_model_path(None)
    config = json.loads((path / "config.json").read_text())
    assert config["max_position_embeddings"] == DEFAULT_MODEL_CONTEXT  # the budget these tests assume
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    tok.chat_template = chat_template()
    return tok


async def _play(tokenizer, reply: str):
    renderer = ChatRenderer(tokenizer)
    engine = RepeatingEngine(tokenizer, renderer, reply)
    cfg = RolloutConfig(max_turns=DEFAULT_MAX_STEPS, max_new_tokens_per_turn=EvalArgs().max_new_tokens,
                        max_total_tokens=engine.max_context_tokens, temperature=0.0)
    async with make("alfworld", split="valid_unseen") as env:
        tasks = env.tasks()
        job = make_jobs(list(zip(tasks.ids, tasks.kinds, strict=True)), samples_per_game=1, limit=1, seed=0)[0]
        result = await model_agent(engine, renderer, cfg)(env, job)
    return result, engine.prompt_lengths


async def test_one_command_replies_play_all_50_steps(tokenizer) -> None:
    result, prompts = await _play(tokenizer, "look")
    assert DEFAULT_MAX_STEPS == 50
    assert result.steps == 50 and result.ending == "truncated"  # the game's step limit, not the token budget
    per_turn = (prompts[-1] - prompts[0]) / (len(prompts) - 1)
    assert 100 < per_turn < 170  # observation, markup and reply: the figure the module docstring states
    assert prompts[-1] < DEFAULT_MODEL_CONTEXT


async def test_replies_with_reasoning_end_by_context_and_say_so(tokenizer) -> None:
    reply = "Thought: I need to find the object first, so I will check the next place. Action: go to countertop 1"
    result, prompts = await _play(tokenizer, reply)
    assert 40 <= result.steps < 50 and result.ending == "context"  # the table's "ending" column names the cause
    assert prompts[-1] <= DEFAULT_MODEL_CONTEXT
