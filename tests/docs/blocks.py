"""The fenced code blocks of a Markdown page, in order: what a docs test runs."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

_FENCE = re.compile(r'^```(\w+)(?:[ \t]+title="([^"]+)")?[ \t]*\n(.*?)^```[ \t]*$', re.S | re.M)


@dataclass(frozen=True)
class Block:
    """One fenced block: its language, its ``title`` (a file name) if any, and its text."""

    lang: str
    title: str | None
    code: str


def code_blocks(page: str | Path) -> list[Block]:
    """The fenced blocks of ``docs/<page>`` (or of the file ``page`` when it is a path), in order."""
    text = (page if isinstance(page, Path) else DOCS / page).read_text()
    return [Block(lang, title or None, code) for lang, title, code in _FENCE.findall(text)]
