"""The README's commands and its example environment are the ones that work."""

from __future__ import annotations

import agentenv
from agentenv.checker import check_env
from tests.docs.blocks import ROOT, code_blocks

README = ROOT / "README.md"


def test_the_readme_test_command_is_what_ci_runs():
    text = README.read_text()
    assert "```\nbash scripts/test.sh\n```" in text
    assert "```\nbash scripts/install.sh && .venv/bin/agentenv train\n```" in text
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert ci[-1] == "bash scripts/test.sh"


async def test_the_readme_environment_registers_and_passes_the_checker():
    (block,) = [b for b in code_blocks(README) if b.lang == "python"]
    try:
        exec(compile(block.code, "README.md", "exec"), {"__name__": "readme_example"})
        env = agentenv.make("me/Echo-v0")
        obs, _ = await env.reset(seed=3)
        word = obs.removeprefix("Repeat this word: ")
        assert word in ("apple", "river", "stone")
        result = await env.step(f" {word}\n")
        assert (result.reward, result.terminated, result.truncated) == (1.0, True, False)
        report = await check_env(agentenv.make("me/Echo-v0"), actions=["apple"])
        assert report.checks[-1] == "close_twice" and "step_after_end_raises" in report.checks
    finally:
        agentenv.registry.pop("me/Echo-v0", None)
