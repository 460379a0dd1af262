"""The generated references (docs/config.md, docs/cli.md) match the code, and the generator's parts work.

When a test here fails because a page is stale, regenerate with `python -m cellseg.docgen` and commit.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from cellseg.docgen import DOCS_DIR, REGENERATE, main, render_all, stale_files
from cellseg.docgen.cli_ref import commands, usage, walk
from cellseg.docgen.config_ref import config_keys, field_docs, parse_attributes, type_text, undocumented_keys
from cellseg.docgen.markdown import anchor, escape

HANDWRITTEN = ("architecture.md", "hpc.md", "real_data.md", "quality.md", "viewing.md", "decisions.md", "usage.md",
               "demo.md", "benchmarks.md")


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    return render_all()


# ------------------------------------------------------------------------------------- the committed pages


def test_generated_pages_are_current(pages: dict[str, str]) -> None:
    stale = stale_files(DOCS_DIR, pages)
    assert not stale, f"docs/{' and docs/'.join(stale)} stale: regenerate with `{REGENERATE}` and commit"


def test_every_config_key_is_in_config_md() -> None:
    text = (DOCS_DIR / "config.md").read_text(encoding="utf-8")
    missing = [key for key in config_keys() if f"`{key}`" not in text]
    assert not missing, f"docs/config.md lacks {missing}: regenerate with `{REGENERATE}`"
    assert {"run_dir", "data.root", "train.max_steps", "val.metric"} <= set(config_keys())


def test_every_model_parameter_is_in_config_md() -> None:
    from cellseg.models import get_entry, list_models

    text = (DOCS_DIR / "config.md").read_text(encoding="utf-8")
    for name in list_models():
        assert f"### `{name}`" in text, f"docs/config.md lacks {name}: regenerate with `{REGENERATE}`"
        for param in get_entry(name).param_names():
            assert f"`model.params.{param}`" in text, f"docs/config.md lacks {name} model.params.{param}"


def test_every_command_is_in_cli_md() -> None:
    text = (DOCS_DIR / "cli.md").read_text(encoding="utf-8")
    titles = [c.title for c in commands()]
    assert {"cellseg train", "cellseg fetch", "cellseg evaluate"} <= set(titles)
    missing = [t for t in titles if f"## `{t}`" not in text]
    assert not missing, f"docs/cli.md lacks {missing}: regenerate with `{REGENERATE}`"


def test_every_config_key_is_documented_in_the_schema() -> None:
    assert not undocumented_keys(), (
        f"keys without documentation: {undocumented_keys()}; add an `Attributes:` entry to the dataclass "
        "docstring or a comment on the field's line in cellseg/config/schema.py, then run " + REGENERATE)


def test_handwritten_docs_link_to_existing_files_and_headings() -> None:
    """Relative links of the hand-written guides point at files of the checkout, and `page.md#anchor` links at
    a heading of that page (GitHub's anchors), so renamed sections of benchmarks.md are caught."""
    import re

    for name in HANDWRITTEN:
        text = (DOCS_DIR / name).read_text(encoding="utf-8")
        for target, fragment in re.findall(r"\]\(([^)#:\s]*)(?:#([^)\s]*))?\)", text):
            path = DOCS_DIR / (target or name)
            assert path.exists(), f"docs/{name} links to {target}, which does not exist"
            if fragment and path.suffix == ".md":
                page = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.MULTILINE | re.DOTALL)
                headings = re.findall(r"^#+ (.+)$", page, flags=re.MULTILINE)
                assert f"#{fragment}" in {anchor(h) for h in headings}, \
                    f"docs/{name} links to {target or name}#{fragment}, which matches no heading there"


def _command_lines(text: str) -> list[str]:
    """`cellseg ...` command lines of a page's fenced blocks (also after `torchrun ... -m`), continuations joined."""
    import re

    lines = []
    for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.removeprefix("$ ").strip()
            start = 0 if line.startswith("cellseg ") else line.find("-m cellseg ") + len("-m ")
            if start >= len("-m ") or line.startswith("cellseg "):
                lines.append(line[start:])
    return lines


def test_handwritten_command_lines_parse_with_the_real_parser(capsys: pytest.CaptureFixture[str]) -> None:
    """Every `cellseg ...` line in the guides' code blocks is accepted by today's argparse parsers, and its
    dotted `key=value` overrides name existing config keys."""
    import re
    import shlex

    from cellseg.cli import build_parser

    parser, keys = build_parser(), set(config_keys())
    checked = 0
    for name in HANDWRITTEN:
        for line in _command_lines((DOCS_DIR / name).read_text(encoding="utf-8")):
            words = shlex.split(line, comments=True)[1:]
            try:
                parser.parse_args(words)
            except SystemExit:
                pytest.fail(f"docs/{name}: `{line}` is not a valid command line: {capsys.readouterr().err}")
            for key in (w.split("=")[0] for w in words if re.match(r"[a-z_]+(\.[a-z_]+)+=", w)):
                assert key in keys or key.startswith("model.params."), f"docs/{name}: unknown config key {key}"
            checked += 1
    assert checked >= 10


REFERENCE_PAGES = ("quality.md", "hpc.md", "reliability.md")
MAX_MEDIAN_SENTENCE_WORDS = 25  # the reference pages stay readable: short sentences, numbers in tables
# a sentence ends at . ? or ! (also inside closing ** or ) or `) before a space and a word that is not lower case
_SENTENCE_END = re.compile(r"(?:(?<=[.?!])|(?<=[.?!]\*\*)|(?<=[.?!]\*)|(?<=[.?!]\)))\s+(?=[^a-z\s])")


def sentence_lengths(text: str) -> list[int]:
    """Words per sentence of a Markdown page's prose: fenced and indented code, tables, headings and images left
    out; every paragraph and list item split at its sentence ends (abbreviations such as "e.g." do not end one)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    pieces: list[str] = []
    for line in text.splitlines():
        if not line.strip() or line.startswith(("    ", "|", "#", "![", "<")):
            pieces.append("\n\n")
            continue
        item = re.match(r"\s*(?:[-*]|\d+\.) ", line)  # a list item starts a paragraph of its own
        if item:
            pieces += ["\n\n", line[item.end():]]
        else:
            pieces.append(line)
    lengths = []
    for paragraph in " ".join(pieces).split("\n\n"):
        paragraph = re.sub(r"\b(e\.g|i\.e|et al|vs|cf)\.", r"\1", " ".join(paragraph.split()))
        lengths += [len(s.split()) for s in _SENTENCE_END.split(paragraph) if s.strip()]
    return lengths


def test_sentence_lengths_split_prose_only() -> None:
    page = ("# A heading of many words that is not prose\n\nOne two three. Four **five.** Six, e.g. seven\n"
            "eight.\n\n- An item (nine.) Ten\n\n| a | table | row |\n\n    indented code line\n\n"
            "```\nfenced code. More.\n```\n")
    assert sentence_lengths(page) == [3, 2, 4, 3, 1]


@pytest.mark.parametrize("name", REFERENCE_PAGES)
def test_reference_pages_keep_sentences_short(name: str) -> None:
    lengths = sentence_lengths((DOCS_DIR / name).read_text(encoding="utf-8"))
    median = statistics.median(lengths)
    assert len(lengths) >= 20 and median <= MAX_MEDIAN_SENTENCE_WORDS, \
        f"docs/{name}: median sentence {median} words over {len(lengths)} sentences (at most " \
        f"{MAX_MEDIAN_SENTENCE_WORDS}): split the long ones, move numbers into tables"


# ------------------------------------------------------------------------------------------- the generator


def test_check_mode_reports_stale_and_write_mode_fixes_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    assert main(["--docs-dir", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cli.md", "config.md"]  # no temporary files left
    assert main(["--check", "--docs-dir", str(tmp_path)]) == 0
    (tmp_path / "cli.md").write_text("edited by hand\n")
    assert main(["--check", "--docs-dir", str(tmp_path)]) == 1
    assert f"cli.md is stale: run `{REGENERATE}`" in capsys.readouterr().err
    assert main(["--docs-dir", str(tmp_path)]) == 0
    assert main(["--check", "--docs-dir", str(tmp_path)]) == 0


def test_attributes_section_parsing() -> None:
    doc = """Summary.

    Attributes:
        root: a data root
            with manifests.
        a, b: two keys, one text.

    Example:
        not: an entry
    """
    assert parse_attributes(doc) == {"root": "a data root with manifests.", "a": "two keys, one text.",
                                     "b": "two keys, one text."}
    assert parse_attributes("No sections.") == {}


@dataclass(frozen=True, kw_only=True)
class _Base:
    """A base.

    Attributes:
        size_nm: edge length.
    """

    size_nm: float = 8.0  # physical, z y x
    mode: Literal["a", "b"] = "a"
    """Attribute docstring of mode."""


@dataclass(frozen=True, kw_only=True)
class _Child(_Base):
    """A child adding keys."""

    count: int | None = None  # pragma: no cover
    tags: tuple[str, ...] = field(default=(), metadata={"doc": "from metadata"})
    plain: bool = True


def test_field_docs_from_every_source_and_base_classes() -> None:
    docs = field_docs(_Child)
    assert docs == {"size_nm": "edge length. (physical, z y x)", "mode": "Attribute docstring of mode.",
                    "tags": "from metadata"}
    assert [f.name for f in dataclasses.fields(_Child)] == ["size_nm", "mode", "count", "tags", "plain"]


@pytest.mark.parametrize(("tp", "text"), [
    (tuple[float, float, float], "[float, float, float]"),
    (tuple[str, ...], "list[str]"),
    (int | Literal["auto"], 'int | "auto"'),
    (float | None, "float | null"),
    (dict[str, tuple[float, float]], "dict[str, [float, float]]"),
])
def test_type_text(tp: object, text: str) -> None:
    assert type_text(tp) == text


def test_markdown_escaping_and_anchors() -> None:
    assert escape("crop<N>/<label> *x* _y_ snake_case `a<b>*c`") == \
        "crop&lt;N&gt;/&lt;label&gt; \\*x\\* \\_y\\_ snake_case `a<b>*c`"
    assert escape("``code`` and :class:`~cellseg.models.base.SegModel`") == "`code` and `SegModel`"
    assert anchor("`cellseg validate-submission`") == "#cellseg-validate-submission"
    assert anchor("`model.params` by architecture") == "#modelparams-by-architecture"


def test_nested_subcommands_aliases_and_usage_wrapping() -> None:
    parser = argparse.ArgumentParser(prog="cellseg")
    sub = parser.add_subparsers(dest="command")
    show = sub.add_parser("show", help="render figures")
    kinds = show.add_subparsers(dest="kind")
    crop = kinds.add_parser("crop", help="a crop with overlays", aliases=["c"])
    crop.add_argument("root")
    crop.add_argument("crop_id", type=int)
    crop.add_argument("--classes", metavar="A,B", required=True)
    crop.add_argument("--z", type=int, nargs="?", default=3)
    for i in range(8):
        crop.add_argument(f"--option-number-{i}", metavar="VALUE")
    found = walk(parser)
    assert [(c.title, c.aliases) for c in found] == [("cellseg show", ()), ("cellseg show crop", ("c",))]
    text = usage("cellseg show crop", crop)
    lines = text.splitlines()
    assert lines[0].startswith("cellseg show crop --classes A,B [--z [Z]]")
    assert all(len(line) <= 100 for line in lines) and len(lines) > 1
    assert all(line.startswith(" " * len("cellseg show crop ")) for line in lines[1:])
    assert text.split()[-2:] == ["root", "crop_id"]  # positionals last, as argparse prints them


# ------------------------------------------------------------------------------- numbers quoted from records


def test_numbers_quoted_from_benchmark_records_match_them() -> None:
    from cellseg.docgen import records

    assert records.quotes(records.pages()), "no page quotes a record: the README's headline numbers should"
    assert records.drift() == [], f"regenerate with `{REGENERATE}` and commit"


def test_a_quoted_number_that_drifted_or_names_nothing_is_reported_and_rewritten(tmp_path: Path) -> None:
    from cellseg.docgen import records

    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    (tmp_path / "bench" / "results" / "r.json").write_text('{"a": {"b": [1.5, 120.0]}, "c": 3}')
    page = tmp_path / "README.md"
    page.write_text("x <!-- record r.json:a.b.1 .1f/60 -->1.9<!-- /record --> min, "
                    "gain <!-- record r.json:a.b.0 / :c * 100 .0f -->50<!-- /record --> %, "
                    "<!-- record r.json:a.z .1f -->7<!-- /record -->\n")
    drift = records.drift(tmp_path)
    assert drift == ["README.md:1: r.json:a.b.1 gives 2.0, the page says 1.9",
                     "README.md:1: r.json:a.z r.json: no 'z' in a.z"]
    assert records.write(tmp_path) == [page]
    assert "-->2.0<!-- /record --> min" in page.read_text() and "-->7<!--" in page.read_text()  # unresolved: kept
    with pytest.raises(KeyError, match=r"not FILE\.json:KEY\.PATH"):
        records.evaluate("r.json:a.b.0 ^ 2", tmp_path / "bench" / "results")
