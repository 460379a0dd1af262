"""Numbers the README and the docs quote from benchmark records (`bench/results/*.json`), filled in from the
records so that a quoted number cannot drift from its measurement.

A quoted number sits between two HTML comments, which a rendered page does not show:

    projected at <!-- record test_set_h200.json:projection.max8_ov25.total_minutes .1f -->55.2<!-- /record --> min

The comment names an expression and a format. The expression is `FILE:KEY.PATH` terms and plain numbers joined
by `+`, `-`, `*` or `/`, evaluated left to right (`a.json:x / a.json:y - 1` is a relative gain); a list index is a
number in the path (`runs.0.score`); a term without its file takes the previous term's (`:y`). The format is a Python format spec (`.1f`, `.4f`, `.0%`,
`,.0f`), optionally followed by `/N` to divide by N first (seconds as minutes: `.1f/60`). `python -m cellseg.docgen` writes every such number again from its record, and `--check` (run by the test
suite) fails when a page quotes a number that its record no longer gives, or names a record or key that does
not exist.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
OPERATORS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
PAGES = ("README.md", "docs/*.md")  # the pages whose quoted numbers are checked (generated references have none)
QUOTE = re.compile(r"<!-- record (?P<expr>[^>]*?) (?P<fmt>[^ >]+) -->(?P<value>.*?)<!-- /record -->")
TERM = re.compile(r"\s*(?P<op>[-+*/])?\s*(?:(?P<number>\d+(?:\.\d+)?)|(?P<file>[\w.-]+\.json)?:(?P<path>[\w.-]+))\s*")


@dataclass(frozen=True)
class Quote:
    """One quoted number: the page, its line, the expression, the format, what the page says and what the records
    give (None when they give nothing: the error says why)."""

    page: Path
    line: int
    expr: str
    fmt: str
    quoted: str
    value: str | None
    error: str | None = None


def lookup(record: Any, path: str, *, where: str) -> float:
    """The number at a dotted `path` of a JSON record.

    Raises:
        KeyError: a missing key or index, or a value that is not a number (naming `where` and the path).
    """
    value = record
    for part in path.split("."):
        if isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        elif isinstance(value, Mapping) and part in value:
            value = value[part]
        else:
            raise KeyError(f"{where}: no {part!r} in {path}")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise KeyError(f"{where}: {path} is {value!r}, not a number")
    return float(value)


def evaluate(expr: str, results: Path = RESULTS, cache: dict[str, Any] | None = None) -> float:
    """The value of an expression of record terms (module docstring).

    Raises:
        KeyError: a term that is not `FILE:KEY.PATH`, a record that does not exist, a missing key.
    """
    cache = {} if cache is None else cache
    total, at, name = 0.0, 0, None
    for match in TERM.finditer(expr):
        if match.start() != at or (at == 0) != (match["op"] is None):
            break
        if match["number"] is not None:
            value = float(match["number"])
        else:
            name = match["file"] or name
            if name is None:
                break
            if name not in cache:
                file = results / name
                if not file.is_file():
                    raise KeyError(f"no record {file}")
                cache[name] = json.loads(file.read_text())
            value = lookup(cache[name], match["path"], where=name)
        total = value if at == 0 else OPERATORS[match["op"]](total, value)
        at = match.end()
    if at != len(expr) or at == 0:
        raise KeyError(f"{expr!r}: not FILE.json:KEY.PATH terms and numbers joined by +, -, * or /")
    return total


def render(value: float, fmt: str) -> str:
    """`value` in the quote's format: a format spec, optionally `/N` to divide by N first.

    Raises:
        ValueError: a format Python does not know, or a divisor that is not a number.
    """
    spec, _, divisor = fmt.partition("/")
    return format(value / float(divisor) if divisor else value, spec)


def quotes(pages: Iterable[Path], results: Path = RESULTS) -> list[Quote]:
    """Every quoted number of `pages`, with what its record gives."""
    cache: dict[str, Any] = {}
    out = []
    for page in pages:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
            for m in QUOTE.finditer(line):
                try:
                    value, error = render(evaluate(m["expr"], results, cache), m["fmt"]), None
                except (KeyError, ValueError) as err:
                    value, error = None, str(err).strip("'\"")
                out.append(Quote(page, number, m["expr"], m["fmt"], m["value"], value, error))
    return out


def refresh(text: str, results: Path = RESULTS) -> str:
    """`text` with every quoted number written again from its record (an unresolvable one is left as it is)."""
    cache: dict[str, Any] = {}

    def fill(m: re.Match[str]) -> str:
        try:
            value = render(evaluate(m["expr"], results, cache), m["fmt"])
        except (KeyError, ValueError):
            return m[0]
        return f"<!-- record {m['expr']} {m['fmt']} -->{value}<!-- /record -->"

    return QUOTE.sub(fill, text)


def pages(root: Path = REPO) -> list[Path]:
    """The pages whose quoted numbers are kept (`PAGES`)."""
    return sorted({p for pattern in PAGES for p in root.glob(pattern)})


def drift(root: Path = REPO) -> list[str]:
    """One line per quoted number that differs from its record or cannot be resolved (empty: none)."""
    return [f"{q.page.relative_to(root)}:{q.line}: {q.expr} "
            + (q.error if q.value is None else f"gives {q.value}, the page says {q.quoted}")
            for q in quotes(pages(root), root / "bench" / "results") if q.value != q.quoted]


def write(root: Path = REPO) -> list[Path]:
    """Rewrite the quoted numbers of every page from their records; the pages changed."""
    changed = []
    for page in pages(root):
        text = page.read_text(encoding="utf-8")
        new = refresh(text, root / "bench" / "results")
        if new != text:
            page.write_text(new, encoding="utf-8")
            changed.append(page)
    return changed
