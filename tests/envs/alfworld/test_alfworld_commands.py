"""parse_command: hand-made replies against a fixed admissible list (no game engine needed)."""

from __future__ import annotations

import pytest

from agentenv.envs.alfworld.commands import MAX_COMMAND_CHARS, normalize, parse_command

ADMISSIBLE = [
    "examine desk 1",
    "go to desk 1",
    "go to drawer 1",
    "go to drawer 10",
    "inventory",
    "look",
    "take alarmclock 2 from desk 1",
]


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("go to desk 1", "go to desk 1"),
        ("GO TO DESK 1.", "go to desk 1"),
        ("  Go to Desk 1 !!! ", "go to desk 1"),
        ("> look", "look"),
        ("I think. Action: Go to drawer 10.\nbecause it is near", "go to drawer 10"),
        ("Let me go to drawer 10 now", "go to drawer 10"),  # longest match, not 'go to drawer 1'
        ("go to drawer 1", "go to drawer 1"),
        ("Thought: go to desk 1 first\nAction: examine desk 1", "examine desk 1"),
        ("take alarmclock 2 from desk 1 and then look", "take alarmclock 2 from desk 1"),
        ("gö to désk 1", "go to desk 1"),  # accents folded
        ("Plan:\ngo to desk 1\nlook", "look"),  # the last full-command line
    ],
)
def test_parse_picks_the_named_admissible_command(reply: str, expected: str) -> None:
    assert parse_command(reply, ADMISSIBLE) == expected


def test_unmatched_reply_passes_through_normalised_for_the_game_to_answer() -> None:
    assert parse_command("Dance wildly!", ADMISSIBLE) == "dance wildly"
    assert parse_command("", ADMISSIBLE) == ""
    assert parse_command("\n\n  \n", ADMISSIBLE) == ""
    assert parse_command("日本語のテキスト", ADMISSIBLE) == ""


def test_long_reply_is_cut_and_never_raises() -> None:
    out = parse_command("x" * 10_000, ADMISSIBLE)
    assert out == "x" * MAX_COMMAND_CHARS
    assert parse_command("blah " * 2000 + "go to desk 1", ADMISSIBLE) == "go to desk 1"


def test_normalize() -> None:
    assert normalize("Go  to\tDésk-1!") == "go to desk 1"
    assert normalize("") == ""
