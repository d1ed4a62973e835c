"""HermesToolCallParser on hand-written replies, including the sloppy formats models produce."""

from __future__ import annotations

from agentenv.rollout.tool_calls import HermesToolCallParser, ToolCall, ToolCallParser

P = HermesToolCallParser()


def test_is_a_tool_call_parser() -> None:
    assert isinstance(P, ToolCallParser)


def test_well_formed_call_and_prose() -> None:
    r = P.parse(
        'Let me compute.\n<tool_call>\n{"name": "python", "arguments": {"code": "print(1+1)"}}\n</tool_call>'
    )
    assert r.calls == (ToolCall("python", {"code": "print(1+1)"}),)
    assert r.errors == ()
    assert r.content == "Let me compute."
    assert r.attempted


def test_two_calls_in_order() -> None:
    r = P.parse(
        '<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call> and '
        '<tool_call>{"name": "b", "arguments": {}}</tool_call>'
    )
    assert [c.name for c in r.calls] == ["a", "b"]
    assert r.calls[0].arguments == {"x": 1}
    assert r.content == "and"


def test_raw_newlines_inside_json_string() -> None:
    text = '<tool_call>{"name": "python", "arguments": {"code": "x = 1\nprint(x)\n\tpass"}}</tool_call>'
    r = P.parse(text)
    assert r.errors == ()
    assert r.calls[0].arguments["code"] == "x = 1\nprint(x)\n\tpass"


def test_arguments_as_json_string() -> None:
    r = P.parse('<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"print(2)\\"}"}</tool_call>')
    assert r.calls == (ToolCall("python", {"code": "print(2)"}),)


def test_close_tag_inside_code_string_does_not_end_the_call() -> None:
    code = 's = "</tool_call>"\nprint(len(s))'
    text = (
        '<tool_call>{"name": "python", "arguments": '
        '{"code": "s = \\"</tool_call>\\"\\nprint(len(s))"}}</tool_call>'
    )
    r = P.parse(text)
    assert r.errors == ()
    assert r.calls[0].arguments["code"] == code
    assert r.content == ""


def test_missing_close_tag_complete_object_at_end_is_accepted() -> None:
    r = P.parse('ok <tool_call>\n{"name": "python", "arguments": {"code": "1"}}\n  ')
    assert r.calls == (ToolCall("python", {"code": "1"}),)
    assert r.errors == ()


def test_missing_close_tag_with_text_after_is_an_error() -> None:
    r = P.parse('<tool_call>{"name": "python", "arguments": {"code": "1"}} and then more words')
    assert r.calls == ()
    assert len(r.errors) == 1
    assert "not closed" in r.errors[0].message


def test_unterminated_object_is_an_error() -> None:
    r = P.parse('<tool_call>{"name": "python", "arguments": {"code": "print(1)"')
    assert r.calls == () and len(r.errors) == 1
    assert r.errors[0].raw.startswith('{"name"')


def test_malformed_json_is_an_error_and_parsing_continues() -> None:
    r = P.parse(
        "<tool_call>{'name': 'python', 'arguments': {}}</tool_call>"
        '<tool_call>{"name": "python", "arguments": {"code": "2"}}</tool_call>'
    )
    assert len(r.errors) == 1 and "not valid JSON" in r.errors[0].message
    assert r.calls == (ToolCall("python", {"code": "2"}),)


def test_missing_brace_before_close_tag_is_an_error() -> None:
    r = P.parse('<tool_call>{"name": "python", "arguments": {"code": "1"}</tool_call> bye')
    assert r.calls == () and len(r.errors) == 1
    assert r.content == "bye"


def test_missing_name_and_bad_arguments() -> None:
    r = P.parse(
        '<tool_call>{"arguments": {}}</tool_call><tool_call>{"name": "p", "arguments": [1]}</tool_call>'
    )
    assert r.calls == ()
    assert [e.message for e in r.errors] == [
        "tool call has no 'name' string",
        "'arguments' must be a JSON object",
    ]


def test_trailing_text_inside_tags_is_an_error() -> None:
    r = P.parse('<tool_call>{"name": "p", "arguments": {}} trailing</tool_call>')
    assert r.calls == () and len(r.errors) == 1


def test_json_in_prose_without_tags_is_not_a_call() -> None:
    r = P.parse('I would call {"name": "python", "arguments": {"code": "1"}} but the answer is \\boxed{3}.')
    assert r.calls == () and r.errors == ()
    assert not r.attempted
    assert r.content.endswith("\\boxed{3}.")


def test_missing_arguments_means_empty_and_parameters_alias() -> None:
    r = P.parse(
        '<tool_call>{"name": "now"}</tool_call><tool_call>{"name": "p", "parameters": {"a": 1}}</tool_call>'
    )
    assert r.calls == (ToolCall("now", {}), ToolCall("p", {"a": 1}))


def test_items_keep_reply_order() -> None:
    r = P.parse(
        '<tool_call>{"name": "a", "arguments": {}}</tool_call>'
        "<tool_call>not json</tool_call>"
        '<tool_call>{"name": "b", "arguments": {}}</tool_call>'
    )
    kinds = [type(i).__name__ for i in r.items]
    assert kinds == ["ToolCall", "ToolCallError", "ToolCall"]
    assert [c.name for c in r.calls] == ["a", "b"] and len(r.errors) == 1


_CALL = '<tool_call>\n{"name": "python", "arguments": {"code": "print(1)"}}\n</tool_call>'


def test_trailing_text_is_ignored_by_default_and_kept_as_content() -> None:
    r = P.parse(_CALL + '"')
    assert r.calls == (ToolCall("python", {"code": "print(1)"}),) and r.errors == ()
    assert r.content == '"'


def test_trailing_text_error_makes_the_reply_one_malformed_call() -> None:
    strict = HermesToolCallParser(trailing_text="error")
    for tail in ('"', " ok", '\n<|im_end|>x'):
        r = strict.parse(_CALL + tail)
        assert r.calls == () and len(r.errors) == 1 and r.attempted
        assert r.errors[0].message.startswith("text after </tool_call>")
        assert r.errors[0].raw == tail.strip()
    # whitespace after the tag, prose before it, and two calls in a row stay well-formed
    assert len(strict.parse(_CALL + "\n  ").calls) == 1
    assert strict.parse("Let me compute.\n" + _CALL).calls == (ToolCall("python", {"code": "print(1)"}),)
    assert len(strict.parse(_CALL + "\n" + _CALL).calls) == 2
    # a reply without any call is the answer, whatever it ends with
    r = strict.parse("The answer is \\boxed{2}.")
    assert not r.attempted and r.content == "The answer is \\boxed{2}."


def test_trailing_text_setting_is_checked() -> None:
    import pytest

    from agentenv.errors import ConfigError

    with pytest.raises(ConfigError, match="trailing_text"):
        HermesToolCallParser(trailing_text="penalise")
