"""A real agent framework from PyPI, Pydantic AI, plays an episode through the endpoint.

Its own loop and tool, its own OpenAI client (plain and streamed): the scripted tool call travels
through the endpoint into the framework, the tool result comes back, and every token of the episode
lands in one row with the right mask.
"""

from __future__ import annotations

import pytest
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from agentenv.rollout.episode import RolloutConfig
from tests.agents.test_endpoint import assert_exact
from tests.agents.test_endpoint_stream import MODEL, ScriptedReplies, served
from tests.agents.tiny import tool_renderer

pytestmark = [pytest.mark.timeout(120)]

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


@pytest.mark.parametrize("stream", [False, True])
async def test_a_pydantic_ai_agent_calls_its_tool_through_the_endpoint(stream):
    renderer = tool_renderer()
    engine = ScriptedReplies(renderer, [CALL, "The sum is 5."])
    cfg = RolloutConfig(max_turns=4, max_new_tokens_per_turn=64, max_total_tokens=600)
    endpoint, session, client = await served(engine, renderer, cfg)
    model = OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=endpoint.base_url, api_key=session.id))
    agent = Agent(model, instructions="Use the add tool.")
    calls = []

    @agent.tool_plain
    def add(a: int, b: int) -> int:
        """Add two integers."""
        calls.append((a, b))
        return a + b

    if stream:
        async with agent.run_stream("What is 2 + 3?") as run:
            output = await run.get_output()
    else:
        output = (await agent.run("What is 2 + 3?")).output
    assert output == "The sum is 5." and calls == [(2, 3)]
    assert session.info["turns"] == 2 and session.info["tool_calls"] == 1
    assert session.info["history_rewrites"] == 0 and len(session.samples) == 1  # one row, extended
    row = session.traj
    assert_exact(session, session.samples)
    (p1, out1), (p2, out2) = session.log
    observed = slice(len(p1) + len(out1.token_ids), len(p2))  # after the call: the tool result
    assert renderer.decode(row.token_ids, keep_special=True).count(CALL) == 1
    assert "5" in renderer.decode(row.token_ids[observed]) and "tool" in renderer.decode(row.token_ids[observed])
    assert set(row.loss_mask[observed]) == {0}
    assert sum(row.loss_mask) == len(out1.token_ids) + len(out2.token_ids)
    await client.close()
    await endpoint.close()
