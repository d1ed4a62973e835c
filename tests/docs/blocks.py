"""The fenced code blocks of a Markdown page, in order: what a docs test runs."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"

_FENCE = re.compile(r'^```(\w+)(?:[ \t]+title="([^"]+)")?[ \t]*\n(.*?)^```[ \t]*$', re.S | re.M)


@dataclass(frozen=True)
class Block:
    """One fenced block: its language, its ``title`` (a file name) if any, and its text."""

    lang: str
    title: str | None
    code: str


def code_blocks(page: str) -> list[Block]:
    """The fenced blocks of ``docs/<page>``, in the order they appear."""
    text = (DOCS / page).read_text()
    return [Block(lang, title or None, code) for lang, title, code in _FENCE.findall(text)]
