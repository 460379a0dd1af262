"""Reference documentation generated from the code, so that it cannot drift.

- `docs/config.md`: every section and key of `cellseg/config/schema.py` (type, default, documentation) and
  the `model.params` of every registered architecture (`config_ref.py`);
- `docs/cli.md`: every `cellseg` command and sub-command, from the argparse parsers (`cli_ref.py`);
- the numbers the README and the other docs quote from benchmark records, rewritten from the records
  (`records.py`), and the inference rates `--dry-run` estimates GPU time with (`cellseg/infer/recorded_rates.json`,
  from `bench/results/inference_h200.json`).

    python -m cellseg.docgen            # regenerate both files and every quoted number
    python -m cellseg.docgen --check    # exit 1 when a page is stale or a number drifted (tests/test_docs.py too)

Example:
    >>> from cellseg.docgen import render_all
    >>> sorted(render_all())
    ['cli.md', 'config.md']
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path

REGENERATE = "python -m cellseg.docgen"
DOCS_DIR = Path(__file__).resolve().parents[2] / "docs"  # the checkout's docs/ (cellseg is installed editable)


def render_all() -> dict[str, str]:
    """File name → content of every generated page."""
    from cellseg.docgen.cli_ref import render_cli
    from cellseg.docgen.config_ref import render_config

    return {"config.md": render_config(generator=REGENERATE), "cli.md": render_cli(generator=REGENERATE)}


def stale_files(docs_dir: Path = DOCS_DIR, pages: dict[str, str] | None = None) -> list[str]:
    """Names of the generated pages that are missing from `docs_dir` or differ from what the code gives."""
    pages = render_all() if pages is None else pages
    return [name for name, text in pages.items()
            if not (docs_dir / name).is_file() or (docs_dir / name).read_text(encoding="utf-8") != text]


def write_pages(docs_dir: Path = DOCS_DIR) -> list[str]:
    """Rewrite the stale pages (temporary file, then rename); returns their names."""
    pages = render_all()
    changed = stale_files(docs_dir, pages)
    docs_dir.mkdir(parents=True, exist_ok=True)
    for name in changed:
        tmp = docs_dir / f".{name}.tmp-{uuid.uuid4().hex[:8]}"
        try:
            tmp.write_text(pages[name], encoding="utf-8")
            os.replace(tmp, docs_dir / name)
        finally:
            tmp.unlink(missing_ok=True)
    return changed


def stale_rates() -> bool:
    """The packaged inference rates (`cellseg.infer.rates`) differ from the benchmark record they come from."""
    from cellseg.infer import rates

    text = rates.render()
    return text is not None and (not rates.PACKAGED.is_file() or rates.PACKAGED.read_text() != text)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m cellseg.docgen [--check] [--docs-dir DIR]`."""
    parser = argparse.ArgumentParser(prog="python -m cellseg.docgen", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report stale pages (exit 1 if any)")
    parser.add_argument("--docs-dir", type=Path, default=DOCS_DIR, help=f"output folder (default {DOCS_DIR})")
    args = parser.parse_args(argv)
    from cellseg.docgen import records
    from cellseg.infer import rates

    if args.check:
        stale = stale_files(args.docs_dir)
        for name in stale:
            print(f"{args.docs_dir / name} is stale: run `{REGENERATE}`", file=sys.stderr)
        drifted = records.drift() + ([f"{rates.PACKAGED} differs from {rates.RECORD}"] if stale_rates() else [])
        for line in drifted:
            print(f"{line}: run `{REGENERATE}`", file=sys.stderr)
        return 1 if stale or drifted else 0
    changed = [str(args.docs_dir / n) for n in write_pages(args.docs_dir)]
    changed += [str(p) for p in records.write()]
    if stale_rates():
        rates.PACKAGED.write_text(rates.render() or "")
        changed.append(str(rates.PACKAGED))
    print(f"wrote {', '.join(changed)}" if changed else "docs are up to date")
    return 0


__all__ = ["DOCS_DIR", "REGENERATE", "main", "render_all", "stale_files", "write_pages"]
