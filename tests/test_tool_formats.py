"""Tool-call parsers per model family, on replies rendered by each family's real template or library.

Every example is what the family's own renderer writes for an assistant turn with tool calls (the
text after the generation prompt, stop token removed, as ``Conversation.add_reply`` hands it to the
environment); malformed variants are made from those by cutting or corrupting them, and must come
back as :class:`ToolCallError`, never as an exception. Assets: ``bash scripts/install_chat_assets.sh``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentenv.errors import ConfigError
from agentenv.rollout.chat import ChatRenderer
from agentenv.rollout.tool_calls import (
    TOOL_PARSERS,
    HermesToolCallParser,
    ToolCall,
    ToolCallError,
    ToolCallParser,
    get_tool_parser,
    parser_for_template,
)
from tests.chat_assets import chat_template, harmony_encoding, hf_tokenizer, mistral_tokenizer

REPO = Path(__file__).resolve().parents[1]
CODE = 'x = 2\nprint(x ** 10, "}")'  # a line break and a brace inside a JSON string
ARGS = {"code": CODE}
TOOLS = [{"type": "function", "function": {
    "name": "python", "description": "Run Python.",
    "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}]
CALL = {"type": "function", "function": {"name": "python", "arguments": ARGS}}
SEARCH = {"type": "function", "function": {"name": "search", "arguments": {"query": "2**10", "k": 3}}}
USER = [{"role": "user", "content": "What is 2**10?"}]


def hf_reply(tok, template: str, assistant: dict, *, stop: str, **kw) -> str:
    """The text a template renders for ``assistant`` after the generation prompt, without ``stop``."""
    prompt = tok.apply_chat_template(USER, tools=TOOLS, chat_template=template, add_generation_prompt=True,
                                     tokenize=False, **kw)
    full = tok.apply_chat_template([*USER, assistant], tools=TOOLS, chat_template=template,
                                   add_generation_prompt=False, tokenize=False, **kw)
    assert full.startswith(prompt)
    reply = full[len(prompt):].rstrip("\n")
    assert reply.endswith(stop)
    reply = reply[: -len(stop)]
    # The real tokenizer decodes the reply's ids back to the same text, special tokens kept.
    assert tok.decode(tok(reply, add_special_tokens=False)["input_ids"], skip_special_tokens=False) == reply
    return reply


def expect_one_error(parsed, fragment: str) -> None:
    assert parsed.calls == () and len(parsed.errors) == 1 and parsed.attempted
    assert fragment in parsed.errors[0].message
    assert isinstance(parsed.items[0], ToolCallError)


# -- registry ----------------------------------------------------------------------------------
def test_every_registered_parser_is_a_parser_and_unknown_names_are_config_errors() -> None:
    assert sorted(TOOL_PARSERS) == ["deepseek", "harmony", "hermes", "llama3_json", "mistral", "qwen25", "qwen3"]
    for name in TOOL_PARSERS:
        parser = get_tool_parser(name)
        assert isinstance(parser, ToolCallParser)
        assert parser.parse("Just an answer: \\boxed{4}.").calls == ()
    with pytest.raises(ConfigError, match="registered: deepseek, harmony"):
        get_tool_parser("gorilla")


def test_parser_chosen_from_real_templates() -> None:
    shipped = (REPO / "agentenv" / "templates" / "chatml_tools.jinja").read_text()
    assert parser_for_template(shipped) == "hermes"
    assert parser_for_template((REPO / "tests" / "chat_templates" / "qwen25.jinja").read_text()) == "hermes"
    assert parser_for_template(chat_template("qwen3")) == "qwen3"
    assert parser_for_template(chat_template("llama3_1")) == "llama3_json"
    assert parser_for_template(chat_template("deepseek_v3")) == "deepseek"
    assert parser_for_template("{{ '[TOOL_CALLS]' }}") == "mistral"
    assert parser_for_template("{{ '<|start|>assistant<|channel|>final<|message|>' }}") == "harmony"
    with pytest.raises(ConfigError, match="no known tool-call syntax"):
        parser_for_template("{% for m in messages %}{{ m.content }}{% endfor %}")


# -- Hermes / Qwen2.5 and Qwen3 ----------------------------------------------------------------
def test_hermes_on_the_shipped_template_rendering() -> None:
    tok = hf_tokenizer("qwen3")
    template = (REPO / "agentenv" / "templates" / "chatml_tools.jinja").read_text()
    reply = hf_reply(tok, template, {"role": "assistant", "content": "Let me run it.", "tool_calls": [CALL, SEARCH]},
                     stop="<|im_end|>")
    parsed = HermesToolCallParser().parse(reply)
    assert parsed.calls == (ToolCall("python", ARGS), ToolCall("search", {"query": "2**10", "k": 3}))
    assert parsed.content == "Let me run it." and parsed.reasoning == ""


@pytest.mark.parametrize("thinking", [True, False])
def test_qwen3_reasoning_is_separated_from_calls_and_answer(thinking: bool) -> None:
    tok, template = hf_tokenizer("qwen3"), chat_template("qwen3")
    assistant = {"role": "assistant", "content": "I'll run it.", "tool_calls": [CALL]}
    if thinking:
        assistant["reasoning_content"] = 'Try <tool_call>{"name": "nope"}</tool_call> in my head first.'
    reply = hf_reply(tok, template, assistant, stop="<|im_end|>", enable_thinking=thinking)
    parsed = get_tool_parser("qwen3").parse(reply)
    assert parsed.calls == (ToolCall("python", ARGS),) and parsed.errors == ()  # the thought is no call
    assert parsed.content == "I'll run it."
    assert parsed.reasoning == (assistant.get("reasoning_content", ""))
    # Malformed: JSON cut short inside the tags; the closing tag missing with text after it.
    expect_one_error(get_tool_parser("qwen3").parse(reply.replace('"}}\n</tool_call>', '"\n</tool_call>')),
                     "not valid JSON")
    cut = reply.replace("\n</tool_call>", " and more words")
    expect_one_error(get_tool_parser("qwen3").parse(cut), "not closed")
    # Cut while thinking: everything is reasoning, nothing is a call.
    open_think = get_tool_parser("qwen3").parse('<think>\nmaybe <tool_call>{"name": "python"}')
    assert not open_think.attempted and open_think.reasoning.startswith("maybe")


# -- Llama 3.1 -----------------------------------------------------------------------------------
def test_llama31_json_calls_rendered_by_its_template() -> None:
    tok, template = hf_tokenizer("llama3_1"), chat_template("llama3_1")
    reply = hf_reply(tok, template, {"role": "assistant", "tool_calls": [CALL]}, stop="<|eot_id|>")
    assert reply.startswith('{"name": "python", "parameters": ')
    p = get_tool_parser("llama3_json")
    assert p.parse(reply).calls == (ToolCall("python", ARGS),)
    two = p.parse(reply + "; " + hf_reply(tok, template, {"role": "assistant", "tool_calls": [SEARCH]},
                                          stop="<|eot_id|>"))
    assert [c.name for c in two.calls] == ["python", "search"]
    assert p.parse("<|python_tag|>" + reply).calls == (ToolCall("python", ARGS),)
    # Built-in tools as the template renders them with builtin_tools.
    builtin = hf_reply(tok, template, {"role": "assistant", "tool_calls": [
        {"type": "function", "function": {"name": "brave_search", "arguments": {"query": "weather in SF"}}}]},
        stop="<|eom_id|>", builtin_tools=["brave_search", "code_interpreter"])
    assert builtin == '<|python_tag|>brave_search.call(query="weather in SF")'
    assert p.parse(builtin).calls == (ToolCall("brave_search", {"query": "weather in SF"}),)
    assert p.parse("<|python_tag|>print(2 ** 10)").calls == (ToolCall("python", {"code": "print(2 ** 10)"}),)
    # Not calls: prose first, JSON data without a name.
    assert not p.parse("Sure! " + reply).attempted
    assert not p.parse('{"answer": 1024}').attempted
    # Malformed.
    expect_one_error(p.parse(reply[:-2]), "not a complete JSON object")
    expect_one_error(p.parse(reply.replace('"parameters": {', '"parameters": {,')), "not valid JSON")
    bad = p.parse(reply + " thanks")
    assert bad.calls == (ToolCall("python", ARGS),) and "unexpected text" in bad.errors[0].message
    expect_one_error(p.parse('<|python_tag|>brave_search.call(query=weather)'), "not k=value")


def test_llama31_conversation_is_exact_with_ipython_results() -> None:
    tok, template = hf_tokenizer("llama3_1"), chat_template("llama3_1")
    r = ChatRenderer(tok, template)
    assert r.end_of_turn_id == tok.convert_tokens_to_ids("<|eot_id|>")
    conv = r.conversation("What is 2**10?", system="Use the tools.", tools=TOOLS)
    ids = list(conv.prompt_ids)
    messages = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "What is 2**10?"}]
    reply = json.dumps({"name": "python", "parameters": ARGS})
    for k in range(4):
        sampled = tok(reply, add_special_tokens=False)["input_ids"] + [r.end_of_turn_id]
        text = conv.add_reply(sampled)
        assert get_tool_parser(parser_for_template(template)).parse(text).calls == (ToolCall("python", ARGS),)
        delta = conv.observe("tool", f"{1024 + k}")
        assert delta.prefix_ok
        # The template writes a tool result through tojson (a string is "iterable" to Jinja).
        assert r.decode(delta.ids, keep_special=True) == (
            f'<|start_header_id|>ipython<|end_header_id|>\n\n"{1024 + k}"<|eot_id|>'
            "<|start_header_id|>assistant<|end_header_id|>\n\n")
        ids += sampled + delta.ids
        messages += [{"role": "assistant", "content": reply}, {"role": "tool", "content": f"{1024 + k}"}]
    whole = tok.apply_chat_template(messages, tools=TOOLS, chat_template=template, add_generation_prompt=True,
                                    tokenize=False)
    assert ids == tok(whole, add_special_tokens=False)["input_ids"]


# -- Mistral ----------------------------------------------------------------------------------------
def mistral_reply(calls: list[tuple[str, str]], content: str | None = None) -> str:
    """The assistant turn mistral-common encodes (v3 tokenizer), decoded with control tokens as text."""
    from mistral_common.protocol.instruct.messages import AssistantMessage, UserMessage
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.protocol.instruct.tool_calls import Function, FunctionCall, Tool
    from mistral_common.protocol.instruct.tool_calls import ToolCall as MToolCall
    from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy

    m = mistral_tokenizer()
    inner = m.instruct_tokenizer.tokenizer
    keep = SpecialTokenPolicy.KEEP
    schema = TOOLS[0]["function"]["parameters"]
    tools = [Tool(function=Function(name="python", description="Run Python.", parameters=schema))]
    tool_calls = [MToolCall(id=f"call{i:05d}", function=FunctionCall(name=n, arguments=a))
                  for i, (n, a) in enumerate(calls)]
    msgs = [UserMessage(content="What is 2**10?"), AssistantMessage(content=content, tool_calls=tool_calls or None),
            UserMessage(content="ok")]
    tokens = m.encode_chat_completion(ChatCompletionRequest(messages=msgs, tools=tools)).tokens
    start = next(i for i, t in enumerate(tokens) if inner.decode([t], special_token_policy=keep) == "[/INST]") + 1
    end = tokens.index(inner.eos_id, start)
    text, run = "", []
    for t in tokens[start:end]:  # control tokens as their text, other runs decoded normally
        if inner.is_special(t):
            text += (inner.decode(run, special_token_policy=SpecialTokenPolicy.IGNORE) if run else "")
            text += inner.decode([t], special_token_policy=keep)
            run = []
        else:
            run.append(t)
    return text + (inner.decode(run, special_token_policy=SpecialTokenPolicy.IGNORE) if run else "")


def test_mistral_tool_calls_encoded_by_mistral_common() -> None:
    reply = mistral_reply([("python", json.dumps(ARGS)), ("search", json.dumps({"query": "2**10", "k": 3}))])
    assert reply.startswith("[TOOL_CALLS]") and '"id": "call00000"' in reply
    p = get_tool_parser("mistral")
    assert p.parse(reply).calls == (ToolCall("python", ARGS), ToolCall("search", {"query": "2**10", "k": 3}))
    # The v11+ form, one [TOOL_CALLS] per call; [THINK] reasoning (Magistral).
    newer = p.parse('[THINK]Use python.[/THINK]Running.[TOOL_CALLS]python[ARGS]{"code": "1"}'
                    '[TOOL_CALLS]search[CALL_ID]a1b2c3d4e[ARGS]{"query": "x"}')
    assert newer.calls == (ToolCall("python", {"code": "1"}), ToolCall("search", {"query": "x"}))
    assert newer.reasoning == "Use python." and newer.content == "Running."
    assert not p.parse(mistral_reply([], content="It is 1024.")).attempted
    # Malformed.
    expect_one_error(p.parse(reply[:-1]), "not closed")
    expect_one_error(p.parse(reply.replace('"name": "python"', "'name': 'python'")), "not valid JSON")
    expect_one_error(p.parse("[TOOL_CALLS] please run python"), "JSON list or name[ARGS]")
    expect_one_error(p.parse('[TOOL_CALLS]python[ARGS]{"code": '), "not valid JSON")


# -- gpt-oss (harmony) ------------------------------------------------------------------------------
def harmony_reply(tail) -> tuple[str, list[int]]:
    from openai_harmony import Conversation, DeveloperContent, Message, Role, SystemContent, ToolDescription

    enc = harmony_encoding()
    head = [Message.from_role_and_content(Role.SYSTEM, SystemContent.new()),
            Message.from_role_and_content(Role.DEVELOPER, DeveloperContent.new().with_function_tools(
                [ToolDescription.new("python", "Run Python.", parameters=TOOLS[0]["function"]["parameters"])])),
            Message.from_role_and_content(Role.USER, "What is 2**10?")]
    prompt = enc.render_conversation_for_completion(Conversation.from_messages(head), Role.ASSISTANT)
    full = enc.render_conversation_for_training(Conversation.from_messages(head + tail(Message, Role)))
    assert full[: len(prompt)] == prompt
    ids = full[len(prompt):]
    assert ids[-1] in enc.stop_tokens_for_assistant_actions()
    return enc.decode_utf8(ids[:-1]), ids


def test_harmony_channels_and_calls_rendered_by_oss_harmony() -> None:
    reply, ids = harmony_reply(lambda M, R: [
        M.from_role_and_content(R.ASSISTANT, "Need 2**10; use the tool.").with_channel("analysis"),
        M.from_role_and_content(R.ASSISTANT, json.dumps(ARGS)).with_channel("commentary")
        .with_recipient("functions.python").with_content_type("<|constrain|>json")])
    assert "<|channel|>commentary to=functions.python <|constrain|>json<|message|>" in reply
    # gpt-oss's Hugging Face tokenizer decodes the same ids to the same text.
    assert hf_tokenizer("gptoss").decode(ids[:-1], skip_special_tokens=False) == reply
    p = get_tool_parser("harmony")
    parsed = p.parse(reply)
    assert parsed.calls == (ToolCall("python", ARGS),) and parsed.reasoning == "Need 2**10; use the tool."
    assert parsed.content == ""
    final, _ = harmony_reply(lambda M, R: [M.from_role_and_content(R.ASSISTANT, "It is 1024.").with_channel("final")])
    answer = p.parse(final)
    assert not answer.attempted and answer.content == "It is 1024."
    assert p.parse("<|channel|>analysis<|message|>run it<|end|><|start|>assistant to=python<|channel|>analysis"
                   "<|message|>print(2 ** 10)").calls == (ToolCall("python", {"code": "print(2 ** 10)"}),)
    # Malformed.
    expect_one_error(p.parse(reply[:-3]), "not valid JSON")
    expect_one_error(p.parse(reply.replace("<|message|>{", "{")), "no <|message|> body")
    expect_one_error(p.parse(reply.replace(json.dumps(ARGS), '["x"]')), "must be a JSON object")


# -- DeepSeek ----------------------------------------------------------------------------------------
def deepseek_reply(calls: list[dict]) -> str:
    """DeepSeek-V3's own template, rendered with Jinja directly: transformers 5 drops ``content: None``,
    which this template needs for an assistant turn of tool calls."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    tok = hf_tokenizer("deepseek_v3")
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    template = env.from_string(chat_template("deepseek_v3"))
    prompt = template.render(messages=USER, bos_token=tok.bos_token, add_generation_prompt=True)
    msgs = [*USER, {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": c["function"]["name"],
                                          "arguments": json.dumps(c["function"]["arguments"])}} for c in calls]}]
    full = template.render(messages=msgs, bos_token=tok.bos_token, add_generation_prompt=False)
    assert full.startswith(prompt)
    reply = full[len(prompt):]
    assert tok.decode(tok(reply, add_special_tokens=False)["input_ids"], skip_special_tokens=False) == reply
    return reply.removesuffix(tok.eos_token)


def test_deepseek_calls_rendered_by_its_template() -> None:
    p = get_tool_parser("deepseek")
    one = deepseek_reply([CALL])  # the V3 template leaves <｜tool▁calls▁end｜> out after one call
    assert "<｜tool▁calls▁end｜>" not in one
    assert p.parse(one).calls == (ToolCall("python", ARGS),)
    two = deepseek_reply([CALL, SEARCH])
    assert p.parse(two).calls == (ToolCall("python", ARGS), ToolCall("search", {"query": "2**10", "k": 3}))
    r1 = p.parse("<think>\nuse python\n</think>\n\nRunning it." + one)
    assert r1.reasoning == "use python" and r1.content == "Running it." and len(r1.calls) == 1
    v31 = p.parse('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>python<｜tool▁sep｜>{"code": "1"}<｜tool▁call▁end｜>'
                  "<｜tool▁calls▁end｜>")
    assert v31.calls == (ToolCall("python", {"code": "1"}),)
    # Malformed.
    expect_one_error(p.parse(one.replace("```<｜tool▁call▁end｜>", "<｜tool▁call▁end｜>")), "fenced block")
    expect_one_error(p.parse(one.replace('"}\n```', '"\n```')), "not valid JSON")
    expect_one_error(p.parse(one.replace("<｜tool▁sep｜>", "")), "no <｜tool▁sep｜>")
    expect_one_error(p.parse(one.split("```json")[0] + '```json\n{"code": '), "not closed")


@pytest.mark.parametrize("name", sorted(TOOL_PARSERS))
@pytest.mark.parametrize("text", ["", "<tool_call>", "[TOOL_CALLS]", "<|python_tag|>", "<|channel|>",
                                  "<｜tool▁call▁begin｜>", "{", '{"name": 3}', "<think>", "\x00\ud7ff}]"])
def test_no_parser_raises_on_fragments(name: str, text: str) -> None:
    parsed = get_tool_parser(name).parse(text)
    assert all(isinstance(i, ToolCall | ToolCallError) for i in parsed.items)
    assert len(parsed.items) == len(parsed.calls) + len(parsed.errors)


def test_python_tool_takes_a_parser_by_name() -> None:
    from agentenv.envs.python_tool import PythonToolEnv
    from agentenv.envs.python_tool.datasets import MathProblem
    from agentenv.rollout.tool_formats import Qwen3ToolCallParser

    problems = [MathProblem("t/0", "What is 2 to the power 10?", "1024", "t")]
    assert isinstance(PythonToolEnv(problems=problems, tool_parser="qwen3").parser, Qwen3ToolCallParser)
    assert isinstance(PythonToolEnv(problems=problems).parser, HermesToolCallParser)
    with pytest.raises(ConfigError, match="unknown tool-call parser 'qwen4'"):
        PythonToolEnv(problems=problems, tool_parser="qwen4")
