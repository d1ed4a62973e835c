"""Turning a model's free-form reply into one ALFWorld command.

Models wrap the command in prose ("I will go to the desk. Action: Go to desk 1."), change its case,
or add punctuation. :func:`parse_command` normalises the reply and looks for the admissible command
it names; when none matches, it returns the normalised text itself so that the game answers with its
own feedback ("Nothing happens.") instead of the environment raising.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

#: Longest command text passed to the game (characters); longer replies are cut.
MAX_COMMAND_CHARS = 200

_ACTION_MARK = re.compile(r"(?:^|\b)(?:action|command|act)\s*[:>]", re.IGNORECASE)


def normalize(text: str) -> str:
    """Lower-case ASCII words separated by single spaces.

    Accents are folded (``désk`` -> ``desk``), other non-ASCII characters and punctuation become
    spaces; digits, letters and spaces are kept.
    """
    folded = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    return " ".join(re.sub(r"[^a-z0-9 ]+", " ", folded.lower()).split())


def _find(command: str, text: str) -> int:
    """Position of ``command`` as whole words in ``text`` (both normalised), or -1."""
    m = re.search(rf"(?<![a-z0-9]){re.escape(command)}(?![a-z0-9])", text)
    return m.start() if m else -1


def parse_command(reply: str, admissible: Sequence[str]) -> str:
    """Pick the command a reply names.

    Order of preference:

    1. the text after the last ``Action:`` (or ``Command:`` / ``Act:``) marker, else each line from
       the last one up, if it equals an admissible command after :func:`normalize`;
    2. the admissible command found (as whole words) in that text, else in the whole reply; the
       longest one wins (``go to drawer 10`` over ``go to drawer 1``), ties go to the later one;
    3. otherwise the normalised first line of the text (cut to :data:`MAX_COMMAND_CHARS`), which the
       game answers with its own feedback; an empty reply gives ``""``.

    Args:
        reply: The model's decoded reply (any length, any characters).
        admissible: The game's admissible commands for the current state.

    Returns:
        A command string (never raises).
    """
    by_norm = {normalize(c): c for c in admissible}
    marks = list(_ACTION_MARK.finditer(reply))
    focus = reply[marks[-1].end() :] if marks else reply
    lines = [normalize(line) for line in focus.splitlines()]
    lines = [line for line in lines if line]
    for line in reversed(lines) if not marks else lines[:1]:
        if line in by_norm:
            return by_norm[line]
    for text in ([lines[0]] if marks and lines else []) + [normalize(focus), normalize(reply)]:
        best: tuple[int, int, str] | None = None
        for norm, original in by_norm.items():
            pos = _find(norm, text) if norm else -1
            if pos >= 0 and (best is None or (len(norm), pos) > best[:2]):
                best = (len(norm), pos, original)
        if best:
            return best[2]
    return lines[0][:MAX_COMMAND_CHARS] if lines else ""
