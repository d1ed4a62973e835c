"""End to end: run_episode with the real tokenizer/template, PythonToolEnv and the process sandbox.

The engine is scripted (it tokenizes fixed replies as a stand-in for sampling), so the test checks
the plumbing exactly: the trajectory's ids equal the tokenization of the whole rendered
conversation, only sampled ids carry loss, and the tool result and reward are right.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentenv.engines.base import GenerationOutput, SamplingParams, TokenSpan
from agentenv.envs.python_tool import PythonToolEnv
from agentenv.envs.python_tool.datasets import MathProblem
from agentenv.envs.python_tool.grading import Grader
from agentenv.rollout.chat import ChatRenderer
from agentenv.rollout.episode import RolloutConfig, run_episode
from tests.smollm_tokenizer import smollm_tokenizer

TEMPLATE = Path(__file__).resolve().parents[3] / "tests" / "chat_templates" / "qwen25.jinja"
REPLIES = [
    "I will compute it.\n<tool_call>\n"
    + json.dumps({"name": "python", "arguments": {"code": "x = 2 ** 10\nprint(x)"}})
    + "\n</tool_call>",
    "The tool printed 1024, so the answer is \\boxed{1024}.",
]


class TokenizingEngine:
    """Returns the scripted replies as token ids plus the end-of-turn id (log-prob -0.25 each)."""

    def __init__(self, tokenizer, replies: list[str], eot: int) -> None:
        self.tok, self.replies, self.eot = tokenizer, replies, eot
        self.prompts: list[list[int]] = []

    @property
    def version(self) -> int:
        return 0

    @property
    def max_context_tokens(self) -> int:
        return 8192

    async def generate(self, prompt_ids, params: SamplingParams) -> GenerationOutput:
        self.prompts.append(list(prompt_ids))
        text = self.replies[len(self.prompts) - 1]
        ids = self.tok(text, add_special_tokens=False)["input_ids"] + [self.eot]
        return GenerationOutput(ids, [-0.25] * len(ids), [TokenSpan(len(ids), 0, 0)], "stop")

    async def update_weights(self, weights, version) -> None:  # pragma: no cover - unused
        pass

    async def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def grader():
    with Grader(workers=1) as g:
        yield g


async def test_episode_ids_match_the_rendered_conversation(grader) -> None:
    tok = smollm_tokenizer()
    template = TEMPLATE.read_text()
    renderer = ChatRenderer(tok, template)
    problem = MathProblem("t/0", "What is 2 to the power 10?", "1024", "t")
    env = PythonToolEnv(problems=[problem], sandbox_backend="process", grader=grader)
    engine = TokenizingEngine(tok, REPLIES, renderer.end_of_turn_id)
    cfg = RolloutConfig(max_turns=4, max_new_tokens_per_turn=256, max_total_tokens=2048)
    traj = await run_episode(env, engine, renderer, cfg, seed=0)
    await env.close()

    assert traj.reward == 1.0
    # The whole conversation rendered at once gives exactly the trajectory's ids (+ nothing after
    # the final reply's end-of-turn token).
    obs0 = problem.problem + "\n\nPut your final answer within \\boxed{}."
    msgs = [
        {"role": "system", "content": env.system_prompt},
        {"role": "user", "content": obs0},
        {"role": "assistant", "content": REPLIES[0]},
        {"role": "tool", "content": "status: ok\nstdout:\n1024"},
    ]
    text = tok.apply_chat_template(
        msgs, tools=list(env.tools), chat_template=template, add_generation_prompt=True, tokenize=False
    )
    expected = tok(text, add_special_tokens=False)["input_ids"]
    final = tok(REPLIES[1], add_special_tokens=False)["input_ids"] + [renderer.end_of_turn_id]
    assert traj.token_ids == expected + final
    assert engine.prompts[1] == expected  # the engine conditioned on exactly these ids
    # Loss only on the two sampled replies.
    n1 = len(tok(REPLIES[0], add_special_tokens=False)["input_ids"]) + 1
    assert sum(traj.loss_mask) == n1 + len(final)
    assert traj.loss_mask[-len(final) :] == [1] * len(final)
    assert traj.num_policy_tokens == n1 + len(final)
