"""Small Markdown helpers for the generated references: escaping, tables, code blocks, anchors.

Text taken from docstrings and argparse help is plain prose with `code spans`; it is escaped outside the
code spans only where GitHub would otherwise eat it (`<label>` read as an HTML tag, `*` as emphasis).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_CODE_SPAN = re.compile(r"(`[^`]*`)")
_RST_ROLE = re.compile(r":[a-z]+:`(~?)([\w.]+)`")  # :class:`~cellseg.models.base.SegModel`
# `_` only emphasises at a word boundary in GitHub Markdown; `snake_case` names stay readable.
_BOUNDARY_UNDERSCORE = re.compile(r"(?<!\w)_|_(?!\w)")


def from_rst(text: str) -> str:
    """Docstrings in reST style: ``code`` and :role:`target` become Markdown code spans."""
    text = _RST_ROLE.sub(lambda m: f"`{m[2].rsplit('.', 1)[-1] if m[1] else m[2]}`", text)
    return text.replace("``", "`")


def escape(text: str) -> str:
    """Escape prose for Markdown (reST code markup converted), leaving `code spans` untouched."""
    parts = _CODE_SPAN.split(from_rst(text))
    for i in range(0, len(parts), 2):  # even indices lie outside code spans
        part = parts[i].replace("\\", "\\\\").replace("*", "\\*").replace("<", "&lt;").replace(">", "&gt;")
        parts[i] = _BOUNDARY_UNDERSCORE.sub(r"\\_", part)
    return "".join(parts)


def cell(text: str) -> str:
    """Table-cell text: one line, `|` escaped (also inside code spans, as GitHub tables require)."""
    return " ".join(text.split()).replace("|", "\\|")


def code(text: str) -> str:
    """An inline code span (a longer fence when the text holds backticks)."""
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub table; cells are already Markdown (use `cell`/`escape`/`code` on them)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def code_block(text: str, lang: str = "text") -> str:
    """A fenced block, verbatim."""
    return f"```{lang}\n{text.rstrip()}\n```"


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    slug = re.sub(r"[^\w\- ]", "", heading.lower())
    return "#" + slug.replace(" ", "-")


def paragraphs(text: str) -> list[str]:
    """Split docstring-style text into paragraphs, each joined into one line."""
    blocks = re.split(r"\n\s*\n", text.strip())
    return [" ".join(b.split()) for b in blocks if b.strip()]
