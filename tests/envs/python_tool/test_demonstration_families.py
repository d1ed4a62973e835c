"""The warm-up's scripted demonstrations with the real chat templates of each tool-call family.

Each transcript must be what a rollout of ``PythonToolEnv`` lays out when the model samples exactly
the demonstration's replies: a replay of those replies through ``run_episode`` (the env parsing with
the template's own tool-call parser, a sandbox printing the scripted answer) must give the same ids
after the prompt, the same loss mask, one tool call and reward 1. A family the demonstrations cannot
write a call for is refused with an error naming it. Real tokenizers: scripts/install_chat_assets.sh.
"""

from __future__ import annotations

import random

import pytest

from agentenv.engines.base import GenerationOutput, SamplingParams, TokenSpan
from agentenv.envs.python_tool import PythonToolEnv
from agentenv.envs.python_tool.datasets import MathProblem
from agentenv.envs.python_tool.demonstrations import scripted_problem
from agentenv.envs.python_tool.grading import Grader
from agentenv.errors import TemplateError
from agentenv.rollout.chat import ChatRenderer
from agentenv.rollout.episode import RolloutConfig, run_episode
from agentenv.rollout.tool_calls import TOOL_PARSERS, get_tool_parser
from agentenv.sandboxes import ExecResult, ExecStatus
from agentenv.trainer.demonstrations import DEMONSTRATION_FAMILIES, render_demonstration, tool_call_text
from tests.chat_assets import chat_template, hf_tokenizer
from tests.smollm_tokenizer import smollm_tokenizer

FAMILIES = [  # (tokenizer, template variables, the tool-call family the template implies)
    ("qwen3", {}, "qwen3"),
    ("qwen3", {"enable_thinking": False}, "qwen3"),
    ("llama3_1", {}, "llama3_json"),
    ("deepseek_v3", {}, "deepseek"),
]


class ReplayEngine:
    """Samples the demonstration's assistant replies, in order (the runs of mask 1)."""

    version = 0
    max_context_tokens = 32768

    def __init__(self, ids: list[int], mask: list[int]) -> None:
        self.replies: list[list[int]] = []
        for i, (tok, m) in enumerate(zip(ids, mask, strict=True)):
            if m and (i == 0 or not mask[i - 1]):
                self.replies.append([])
            if m:
                self.replies[-1].append(tok)

    async def generate(self, prompt_ids, params: SamplingParams) -> GenerationOutput:
        ids = self.replies.pop(0)
        return GenerationOutput(ids, [-0.5] * len(ids), [TokenSpan(len(ids), 0, 0)], "stop")


class AnswerSandbox:
    """Prints the scripted answer, as the scripted code does."""

    backend = "fake"
    isolation = "none"

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.codes: list[str] = []

    async def run(self, code: str, *, timeout_s: float | None = None) -> ExecResult:
        self.codes.append(code)
        return ExecResult(ExecStatus.OK, stdout=self.answer + "\n")

    async def close(self) -> None:
        pass


class OnePool:
    backend = "fake"

    def __init__(self, sandbox: AnswerSandbox) -> None:
        self.sandbox = sandbox

    async def acquire(self) -> AnswerSandbox:
        return self.sandbox

    async def release(self, sb: AnswerSandbox) -> None:
        pass

    async def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def grader():
    with Grader(workers=1) as g:
        yield g


def _demonstration(renderer: ChatRenderer, tok, seed: int):
    encode = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    demo, = PythonToolEnv.scripted_demonstrations(count=1, seed=seed)
    ids, mask = render_demonstration(renderer, encode, demo)
    return ids, mask, scripted_problem(random.Random(seed))


@pytest.mark.parametrize(("name", "kwargs", "family"), FAMILIES, ids=lambda v: str(v))
async def test_the_demonstration_is_what_a_rollout_of_its_replies_lays_out(grader, name, kwargs, family) -> None:
    tok = hf_tokenizer(name)
    renderer = ChatRenderer(tok, chat_template(name), template_kwargs=kwargs)
    assert renderer.tool_parser_name == family
    for seed in (0, 1, 2):
        ids, mask, solution = _demonstration(renderer, tok, seed)
        engine = ReplayEngine(ids, mask)
        call_reply = tok.decode(engine.replies[0][:-1], skip_special_tokens=False)
        parsed = get_tool_parser(family).parse(call_reply)  # the family's own call syntax
        assert [(c.name, dict(c.arguments)) for c in parsed.calls] == [("python", {"code": solution.code})]
        sandbox = AnswerSandbox(solution.answer)
        env = PythonToolEnv(problems=[MathProblem("demo/0", solution.problem, solution.answer, "demo")],
                            sandbox_pool=OnePool(sandbox), grader=grader, tool_parser=family)
        cfg = RolloutConfig(max_turns=4, max_new_tokens_per_turn=1024, max_total_tokens=8192)
        traj = await run_episode(env, engine, renderer, cfg, options={"task": 0})
        assert traj.status == "completed" and traj.reward == 1.0 and sandbox.codes == [solution.code]
        assert traj.info["tool_calls"] == 1
        # the same layout after the prompt (the env's prompt also asks for a box: the demonstration's does not)
        start = mask.index(1)  # the demonstration's prompt ends where its first reply starts
        after = traj.token_ids[traj.prompt_length:]
        assert after == ids[start:] and traj.loss_mask[traj.prompt_length:] == mask[start:]
        await env.close()


def test_qwen3_thinking_replies_open_with_the_empty_think_block_its_template_writes() -> None:
    tok = hf_tokenizer("qwen3")
    for kwargs, opening in (({}, "<think>\n\n</think>\n\n"), ({"enable_thinking": False}, "")):
        renderer = ChatRenderer(tok, chat_template("qwen3"), template_kwargs=kwargs)
        ids, mask, _ = _demonstration(renderer, tok, 0)
        replies = ReplayEngine(ids, mask).replies
        texts = [tok.decode(r, skip_special_tokens=False) for r in replies]
        assert texts[0].startswith(opening + "<tool_call>\n") and texts[1].startswith(opening + "The code prints")


def test_a_family_without_a_scripted_call_is_refused_naming_it() -> None:
    tok = smollm_tokenizer()
    harmony_like = ("{# renders <|channel|> messages #}{% for m in messages %}<|im_start|>{{ m.role }}\n"
                    "{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                    "{% endif %}")
    renderer = ChatRenderer(tok, harmony_like)
    assert renderer.tool_parser_name == "harmony"
    with pytest.raises(TemplateError, match="chat template family 'harmony'"):
        _demonstration(renderer, tok, 0)


def test_every_scripted_call_reads_back_with_its_familys_parser() -> None:
    code = 'import math\nprint(math.ceil(7 / 2), "a\\"b")'
    for family in DEMONSTRATION_FAMILIES:  # mistral's too, whose template is not installed here
        parsed = get_tool_parser(family).parse(tool_call_text([("python", {"code": code})], family))
        assert not parsed.errors and [(c.name, dict(c.arguments)) for c in parsed.calls] == [("python", {"code": code})]
        if family != "llama3_json":  # two calls in one reply, in order
            two = [("python", {"code": code}), ("search", {"query": "ceil", "k": 2})]
            parsed = get_tool_parser(family).parse(tool_call_text(two, family))
            assert not parsed.errors and [(c.name, dict(c.arguments)) for c in parsed.calls] == two
    with pytest.raises(TemplateError, match="one tool call per reply"):
        tool_call_text([("a", {}), ("b", {})], "llama3_json")
    assert set(DEMONSTRATION_FAMILIES) | {"harmony"} == set(TOOL_PARSERS)  # every other family is refused by name
