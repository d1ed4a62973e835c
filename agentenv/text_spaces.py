"""A Gymnasium ``Text`` space for observations that may hold any Unicode text.

Tool output and math problems contain characters outside printable ASCII (``’``, ``π``, box
drawing in tracebacks). :class:`UnicodeText` accepts any string of allowed length without NUL
characters; it samples from printable ASCII, so ``sample()`` stays cheap and reproducible.
"""

from __future__ import annotations

from typing import Any

from gymnasium import spaces

from agentenv.core import TEXT_CHARSET


class UnicodeText(spaces.Text):
    """``spaces.Text`` whose ``contains`` accepts any Unicode string of length ``[min_length, max_length]``.

    Args:
        max_length: Longest allowed string, in characters.
        min_length: Shortest allowed string, in characters.
    """

    def __init__(self, max_length: int = 65_536, *, min_length: int = 0, seed: Any = None) -> None:
        super().__init__(max_length, min_length=min_length, charset="".join(sorted(TEXT_CHARSET)), seed=seed)

    def contains(self, x: Any) -> bool:
        """True for a ``str`` of allowed length with no NUL character."""
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length and "\x00" not in x

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, UnicodeText) and (self.min_length, self.max_length) == (
            other.min_length,
            other.max_length,
        )
