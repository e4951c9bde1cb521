"""LaTeX answer extraction shared by data preparation (MATH ground truth) and the scorers."""

from __future__ import annotations

import re

_SHORT_BOXED = re.compile(r"[^\s$]+")


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`), nested braces balanced; None when there is none.

    Also reads the short form `\\boxed 5` (one token, up to whitespace or `$`) that a few solutions use.
    """
    boxed, fbox = text.rfind("\\boxed"), text.rfind("\\fbox")
    idx = max(boxed, fbox)
    if idx < 0:
        return None
    start = idx + (len("\\boxed") if idx == boxed else len("\\fbox"))
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
                    return text[i + 1 : j]
        return None
    if i > start:
        m = _SHORT_BOXED.match(text, i)
        return m.group(0) if m else None
    return None
