"""What the trainer takes from the model: chat-template variables (``model.chat_template_kwargs``) and the
tool-call parser the template implies (for an env whose constructor takes ``tool_parser``)."""

from __future__ import annotations

import pytest

import agentenv
from agentenv import eval_command
from agentenv.errors import ConfigError
from agentenv.models import chat_template
from agentenv.rollout.chat import ChatRenderer
from agentenv.trainer import recipe, setup
from tests.agents.tiny import tiny_smollm_lm, tool_renderer
from tests.fakes import CharRenderer
from tests.smollm_tokenizer import smollm_tokenizer

ID = "tests/TakesParser-v0"
#: The shipped tool template plus Qwen3's thinking-off generation prompt (empty think tags).
THINKING = chat_template() + ("{%- if add_generation_prompt and enable_thinking is defined and not enable_thinking -%}"
                              "{{- '<think>\n\n</think>\n\n' }}{%- endif -%}")


class TakesParserEnv(agentenv.Env):
    def __init__(self, tool_parser=None, turns: int = 1):
        self.tool_parser = tool_parser

    async def step(self, action):
        raise NotImplementedError


@pytest.fixture
def parser_env():
    agentenv.register(ID, f"{__name__}:TakesParserEnv")
    yield ID
    agentenv.registry.pop(ID, None)


def cfg_of(*overrides: str):
    return recipe.parse_args(["--recipe", "generic_cpu", *overrides])[0]


def test_the_template_picks_the_parser_unless_the_config_does(parser_env, guess_number):
    qwen3 = ChatRenderer(smollm_tokenizer(), THINKING)  # <tool_call> and <think>: Qwen3's syntax
    assert qwen3.tool_parser_name == "qwen3" and tool_renderer().tool_parser_name == "hermes"
    assert setup.default_env_kwargs(cfg_of("--env", parser_env), qwen3) == {"tool_parser": "qwen3"}
    assert setup.default_env_kwargs(cfg_of("--env", parser_env), tool_renderer()) == {"tool_parser": "hermes"}
    env = setup.env_factory(cfg_of("--env", parser_env), qwen3)()
    assert env.tool_parser == "qwen3"
    # the config's choice stands; without a renderer (the early check) nothing is filled
    cfg = cfg_of("--env", parser_env, "env.kwargs.tool_parser=mistral")
    assert setup.default_env_kwargs(cfg, qwen3) == {} and setup.env_factory(cfg, qwen3)().tool_parser == "mistral"
    assert setup.env_factory(cfg_of("--env", parser_env))().tool_parser is None
    # an env that takes no tool_parser, and a renderer that names none, get nothing
    assert setup.default_env_kwargs(cfg_of("--env", guess_number), qwen3) == {}
    assert setup.default_env_kwargs(cfg_of("--env", parser_env), CharRenderer()) == {}
    # python_tool takes one: the generic rule reaches it without naming it
    assert setup.default_env_kwargs(cfg_of("--env", "python_tool"), qwen3) == {"tool_parser": "qwen3"}


def test_chat_template_kwargs_reach_the_renderer(monkeypatch):
    cfg = cfg_of("model.chat_template_kwargs.enable_thinking=false")
    assert cfg.model.chat_template_kwargs == {"enable_thinking": False}
    assert cfg_of().model.chat_template_kwargs == {}
    import agentenv.models

    monkeypatch.setattr(agentenv.models, "load_model_and_tokenizer",
                        lambda name, device: (tiny_smollm_lm(), smollm_tokenizer()))
    _, _, renderer = setup.load_policy(cfg)
    assert renderer.template_kwargs == {"enable_thinking": False}
    # a template that reads them renders its thinking-off prompt
    tok = smollm_tokenizer()
    on = ChatRenderer(tok, THINKING).initial_prompt("hi")
    off = ChatRenderer(tok, THINKING, template_kwargs=cfg.model.chat_template_kwargs).initial_prompt("hi")
    assert off[: len(on)] == on and tok.decode(off[len(on):]) == "<think>\n\n</think>\n\n"
    # the warm-up cache key changes with them (demonstrations render differently), not without them
    hermes = ChatRenderer(tok, chat_template())
    assert setup.warmup_cache_key(cfg, hermes) != setup.warmup_cache_key(cfg_of(), hermes)


def test_agentenv_eval_reads_chat_template_kwargs():
    args = eval_command.parse_args(["--env", "alfworld", "--chat-template-kwarg", "enable_thinking=false",
                                    "--chat-template-kwarg", "depth=2"])
    assert eval_command.template_kwargs(args) == {"enable_thinking": False, "depth": 2}
    bad = eval_command.parse_args(["--env", "alfworld", "--chat-template-kwarg", "enable_thinking"])
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        eval_command.template_kwargs(bad)
