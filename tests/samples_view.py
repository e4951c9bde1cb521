"""The training samples page as Prefect's UI draws it: the code blocks of a markdown artifact's rendered DOM.

Prefect 3's artifact page (`/artifacts/artifact/<id>`) renders a markdown artifact inside
`<article class="markdown-renderer artifact-data-markdown">`; a fenced code block becomes
`<pre class="p-code-container p-code-container--block markdown-renderer__code"><code>…</code></pre>`, its text
HTML-escaped (`&lt;answer&gt;`) with its line breaks as they were."""

from __future__ import annotations

import html
import re

_CODE_BLOCK = re.compile(r'<pre class="[^"]*\bmarkdown-renderer__code\b[^"]*"><code[^>]*>(.*?)</code></pre>', re.S)


def sample_blocks(dom: str) -> list[str]:
    """The text of every code block the page drew, as a reader sees it (tags as text, line breaks kept)."""
    return [html.unescape(re.sub(r"<[^>]+>", "", block)) for block in _CODE_BLOCK.findall(dom)]


def readable_responses(dom: str) -> list[str]:
    """The code blocks that hold an `<answer>` tag across more than one line: responses whose format survived."""
    return [block for block in sample_blocks(dom) if "<answer>" in block and "\n" in block]
