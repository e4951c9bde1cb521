"""LaTeX answer extraction shared by data preparation (MATH ground truth) and the scorers."""

from __future__ import annotations

import re

_SHORT_BOXED = re.compile(r"[^\s$]+")
_BOX = re.compile(r"\\boxed|\\fbox")


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`), nested braces balanced; None when there is none.

    Also reads the short form `\\boxed 5` (one token, up to whitespace or `$`) that a few solutions use.
    """
    boxed, fbox = text.rfind("\\boxed"), text.rfind("\\fbox")
    idx = max(boxed, fbox)
    if idx < 0:
        return None
    start = idx + (len("\\boxed") if idx == boxed else len("\\fbox"))
    return _box_content(text, start)[0]


def all_boxed(text: str) -> list[str]:
    """Contents of every `\\boxed{...}`/`\\fbox{...}` in order, as `last_boxed` reads each; a box inside
    another box is part of the outer one's content."""
    found: list[str] = []
    pos = 0
    while m := _BOX.search(text, pos):
        content, end = _box_content(text, m.end())
        if content is not None:
            found.append(content)
        pos = max(end, m.end())
    return found


def _box_content(text: str, start: int) -> tuple[str | None, int]:
    """(content, end) of the box whose command ends at `start`; (None, start) when unreadable."""
    i = start
    while i < len(text) and text[i].isspace():
        i += 1
    if i < len(text) and text[i] == "{":
        depth = 0
        for j in range(i, len(text)):
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0:
                    return text[i + 1 : j], j + 1
        return None, start
    if i > start:
        m = _SHORT_BOXED.match(text, i)
        if m:
            return m.group(0), m.end()
    return None, start
