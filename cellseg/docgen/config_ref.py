"""docs/config.md: every section and key of the config schema, with type, default and documentation.

Sources, all read from the code at generation time:
- the dataclasses of `cellseg.config.schema`; a root is a dataclass no other schema dataclass contains
  (today `RunConfig`), its dataclass fields are sections (recursively), the others are keys;
- the inference commands' roots (`cellseg.config.jobs.JOBS`): each command's own keys, then every section
  they compose (`cellseg.config.inference`), once;
- a key's documentation, first found of: `field(metadata={"doc": ...})`, the class docstring's Google
  `Attributes:` entry (`a, b: text` documents both), a string literal right after the field (attribute
  docstring), and the comment on the field's line(s); an entry and a comment together read "entry (comment)".
  Base classes are searched too;
- the architectures' params dataclasses from the model registry (`model.params` by architecture).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import json
import re
import textwrap
import tokenize
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from cellseg.docgen.markdown import anchor, code, code_block, escape, paragraphs, table

_SECTION_HEADER = re.compile(r"^(Attributes|Args|Arguments|Example|Examples|Note|Notes|Raises|Returns):\s*$")
_ENTRY = re.compile(r"^(\w+(?:\s*,\s*\w+)*)\s*:\s*(.*)$")
NO_DOC = "(undocumented)"


# ------------------------------------------------------------------------------------------ documentation


def docstring_intro(cls: type) -> str:
    """The class docstring without its Google sections (`Attributes:`, `Example:`, ...)."""
    lines = inspect.cleandoc(cls.__doc__ or "").splitlines()
    for i, line in enumerate(lines):
        if _SECTION_HEADER.match(line):
            lines = lines[:i]
            break
    return "\n".join(lines).strip()


def docstring_example(cls: type) -> str:
    """The class docstring's Google `Example:` section, dedented (a YAML snippet of the section), or ""."""
    lines = inspect.cleandoc(cls.__doc__ or "").splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == "Example:"), None)
    if start is None:
        return ""
    body = []
    for line in lines[start + 1:]:
        if line.strip() and not line.startswith(" "):  # the next section
            break
        body.append(line)
    return textwrap.dedent("\n".join(body)).strip()


def parse_attributes(doc: str) -> dict[str, str]:
    """Entries of a Google `Attributes:` section; `a, b: text` documents both names."""
    out: dict[str, str] = {}
    lines = inspect.cleandoc(doc or "").splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Attributes:")
    except StopIteration:
        return out
    indent, names = None, []
    for line in lines[start + 1:]:
        if not line.strip() or not line.startswith(" "):  # a blank line or a new section ends it
            break
        depth = len(line) - len(line.lstrip())
        indent = depth if indent is None else indent
        match = _ENTRY.match(line.strip())
        if depth == indent and match:
            names = [n.strip() for n in match[1].split(",")]
            out.update({n: match[2].strip() for n in names})
        else:  # continuation of the previous entry
            out.update({n: f"{out[n]} {line.strip()}".strip() for n in names})
    return out


def source_notes(cls: type) -> dict[str, str]:
    """Per field defined in `cls`'s own body: its attribute docstring and/or line comments."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # no source (e.g. built dynamically)
        return {}
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            text = tok.string.lstrip("#").strip()
            if not re.match(r"(noqa|type:|pragma)\b", text):
                comments[tok.start[0]] = text
    body = ast.parse(source).body[0].body  # type: ignore[attr-defined]
    notes: dict[str, str] = {}
    for node, after in zip(body, [*body[1:], None], strict=True):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        parts = []
        if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
            parts.append(" ".join(after.value.value.split()))
        parts += [comments[n] for n in range(node.lineno, (node.end_lineno or node.lineno) + 1) if n in comments]
        if parts:
            notes[node.target.id] = "; ".join(parts)
    return notes


def field_docs(cls: type) -> dict[str, str]:
    """Documentation of every field of dataclass `cls` (missing ones absent), base classes included."""
    docs: dict[str, str] = {}
    for klass in reversed([k for k in cls.__mro__ if dataclasses.is_dataclass(k)]):
        entries, notes = parse_attributes(klass.__doc__ or ""), source_notes(klass)
        for name in {*entries, *notes}:
            if name in entries and name in notes:
                docs[name] = f"{entries[name]} ({notes[name]})"
            else:
                docs[name] = entries.get(name) or notes[name]
    for f in dataclasses.fields(cls):
        if f.metadata.get("doc"):
            docs[f.name] = str(f.metadata["doc"])
    return {f.name: docs[f.name] for f in dataclasses.fields(cls) if f.name in docs}


# ------------------------------------------------------------------------------------------- types, values


def type_text(tp: Any) -> str:
    """A YAML-minded rendering of a type annotation: `null`, `"a" | "b"`, `[float, float, float]`."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is type(None):
        return "null"
    if tp is Any:
        return "any"
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_text(a) for a in args)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"list[{type_text(args[0])}]"
        return "[" + ", ".join(type_text(a) for a in args) + "]"
    if origin in (list, typing.Sequence):
        return f"list[{type_text(args[0]) if args else 'any'}]"
    if origin is dict or tp is dict:
        return f"dict[{', '.join(type_text(a) for a in args)}]" if args else "dict"
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def value_text(value: Any) -> str:
    """A default as it would be written in YAML flow style (JSON is valid YAML)."""
    from cellseg.config.load import to_dict

    return json.dumps(to_dict(value), ensure_ascii=False)


def default_text(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return code(value_text(f.default))
    if f.default_factory is not dataclasses.MISSING:
        return code(value_text(f.default_factory()))
    return "**required**"


# ----------------------------------------------------------------------------------------------- the schema


def _dataclasses_in(tp: Any) -> Iterator[type]:
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        yield tp
    for arg in typing.get_args(tp):
        yield from _dataclasses_in(arg)


def _section_type(tp: Any) -> tuple[type | None, bool]:
    """(dataclass, is_list) when a field holds a dataclass or a list of them, else (None, False)."""
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return tp, False
    if typing.get_origin(tp) in (tuple, list):
        inner = [a for a in typing.get_args(tp) if a is not Ellipsis]
        if len(inner) == 1 and dataclasses.is_dataclass(inner[0]):
            return inner[0], True
    return None, False


def schema_roots() -> list[type]:
    """Dataclasses of `cellseg.config.schema` that no other schema dataclass contains, in source order."""
    from cellseg.config import schema

    classes = [c for c in vars(schema).values()
               if isinstance(c, type) and dataclasses.is_dataclass(c) and c.__module__ == schema.__name__]
    contained = {inner for c in classes for tp in typing.get_type_hints(c).values() for inner in _dataclasses_in(tp)}
    roots = [c for c in classes if c not in contained]
    return sorted(roots, key=lambda c: inspect.getsourcelines(c)[1])


@dataclass(frozen=True)
class Section:
    """One table of the reference: a dataclass reached at a dotted prefix."""

    prefix: str  # "" for a root's own keys, "data", "ensemble.members[]", ...
    cls: type


def sections(root: type, prefix: str = "") -> list[Section]:
    """The root's own keys first, then each dataclass field as its own section (depth first)."""
    out = [Section(prefix, root)]
    hints = typing.get_type_hints(root)
    for f in dataclasses.fields(root):
        inner, is_list = _section_type(hints[f.name])
        if inner is not None:
            out += sections(inner, f"{prefix}{f.name}{'[]' if is_list else ''}.")
    return out


def leaf_fields(cls: type) -> list[dataclasses.Field]:
    hints = typing.get_type_hints(cls)
    return [f for f in dataclasses.fields(cls) if _section_type(hints[f.name])[0] is None]


def job_roots() -> dict[str, type]:
    """Command name → root config of the inference commands (`cellseg.config.jobs.JOBS`)."""
    from cellseg.config.jobs import JOBS

    return dict(JOBS)


def all_roots() -> list[type]:
    """The training roots, then the inference commands' roots."""
    return [*schema_roots(), *job_roots().values()]


def config_keys() -> list[str]:
    """Every dotted key of every root (what `docs/config.md` must list)."""
    return list(dict.fromkeys(f"{s.prefix}{f.name}" for root in all_roots() for s in sections(root)
                              for f in leaf_fields(s.cls)))


def undocumented_keys() -> list[str]:
    """Dotted keys with no documentation in the schema."""
    out = []
    for root in all_roots():
        for section in sections(root):
            docs = field_docs(section.cls)
            out += [f"{section.prefix}{f.name}" for f in leaf_fields(section.cls) if f.name not in docs]
    return list(dict.fromkeys(out))


# ---------------------------------------------------------------------------------------------- rendering


def _key_table(section: Section) -> str:
    hints, docs = typing.get_type_hints(section.cls), field_docs(section.cls)
    rows = [[code(section.prefix + f.name), code(type_text(hints[f.name])), default_text(f),
             escape(docs.get(f.name, NO_DOC))] for f in leaf_fields(section.cls)]
    return table(["key", "type", "default", "description"], rows)


def _section_title(section: Section, root: type) -> str:
    return f"`{section.prefix.rstrip('.')}`" if section.prefix else f"{root.__name__}: top-level keys"


def _section_intro(section: Section) -> list[str]:
    """The section's class summary, and its `Example:` as a YAML block when it has one."""
    out = [f"`{section.cls.__name__}`: " + escape(" ".join(paragraphs(docstring_intro(section.cls)))), ""]
    example = docstring_example(section.cls)
    return [*out, code_block(example, "yaml"), ""] if example else out


def _render_root(root: type) -> list[str]:
    out = [f"## {root.__name__}", "", *[escape(p) + "\n" for p in paragraphs(docstring_intro(root))]]
    for section in sections(root):
        if not leaf_fields(section.cls):
            continue
        out += [f"### {_section_title(section, root)}", ""]
        if section.prefix:
            out += _section_intro(section)
        out += [_key_table(section), ""]
    return out


def _job_sections() -> list[Section]:
    """The sections the inference commands compose, each once, in order of first use."""
    seen: dict[str, Section] = {}
    for root in job_roots().values():
        for section in sections(root)[1:]:
            seen.setdefault(section.prefix, section)
    return list(seen.values())


def _job_title(command: str) -> str:
    return f"`cellseg {command}`: top-level keys"


def _render_jobs() -> list[str]:
    rows = [[code(root.__name__), escape(docstring_intro(root)),
             ", ".join(code(s.prefix.rstrip(".")) for s in sections(root)[1:] if s.prefix.count(".") == 1)]
            for root in job_roots().values()]
    out = ["## Inference commands", "", INFERENCE_INTRO, "", table(["root", "command", "sections"], rows), ""]
    for command, root in job_roots().items():
        out += [f"### {_job_title(command)}", "", _key_table(Section("", root)), ""]
    for section in _job_sections():
        if leaf_fields(section.cls):
            out += [f"### `{section.prefix.rstrip('.')}`", "", *_section_intro(section), _key_table(section), ""]
    return out


def _render_model_params() -> list[str]:
    from cellseg.models import get_entry, list_models, resolve_params

    out = ["## `model.params` by architecture", "",
           "`model.params` overrides fields of the architecture's parameter dataclass; `model.preset: tiny` "
           "starts from the values in the *tiny* column (CPU tests and smoke runs). "
           "`cellseg models` prints parameters and FLOPs per architecture.", ""]
    for name in list_models():
        entry = get_entry(name)
        default, tiny = resolve_params(name, preset="default"), resolve_params(name, preset="tiny")
        hints, docs = typing.get_type_hints(entry.params_type), field_docs(entry.params_type)
        patch = "×".join(str(n) for n in entry.presets["default"].patch_shape_vox)
        tiny_patch = "×".join(str(n) for n in entry.presets["tiny"].patch_shape_vox)
        voxel = "×".join(f"{v:g}" for v in entry.default_voxel_size_nm)
        out += [f"### `{name}`", "", f"{escape(entry.summary)} Parameters: `{entry.params_type.__name__}`; "
                f"default patch {patch} voxels (tiny: {tiny_patch}) at {voxel} nm.", ""]
        rows = []
        for f in dataclasses.fields(entry.params_type):
            d, t = getattr(default, f.name), getattr(tiny, f.name)
            rows.append([code(f"model.params.{f.name}"), code(type_text(hints[f.name])), code(value_text(d)),
                         "same" if t == d else code(value_text(t)), escape(docs.get(f.name, NO_DOC))])
        out += [table(["key", "type", "default", "tiny", "description"], rows), ""]
    return out


INTRO = """\
A run is configured by one YAML file whose top-level keys are the sections below. Files compose with
`include: [a.yaml, b.yaml]` (paths relative to the including file, deep-merged left to right, the file's own
keys last), and the command line overrides existing keys with dotted `key=value` pairs parsed as YAML:

```bash
cellseg train configs/experiments/unet_3d.yaml data.root=/data/cellmap train.max_steps=20000 optim.lr=1e-4
cellseg train configs/smoke/unet_3d.yaml data.root=/tmp/synth --print-config   # the resolved config
```

Unknown keys and wrong types are errors that name the dotted key and the valid choices. Lengths carry their
unit in the name (`_nm` nanometres, `_vox` voxels); vectors are (z, y, x). `null` is YAML's None. The
resolved config of a run is written to `RUN_DIR/config.yaml`. Ready-made files live in `configs/`
(`data/`, `model/`, `train/`, `experiments/` one per architecture, `smoke/` CPU runs of seconds). The
inference commands are configured the same way: see [Inference commands](#inference-commands)."""

INFERENCE_INTRO = """\
`cellseg predict`, `predict-ensemble`, `ensemble` and `postprocess` take a recipe file too (`configs/infer/`,
`configs/ensemble/`, `configs/postprocess/`, composed with `include:` like the training files), and each of
their options sets one key (its `--help` names it). Precedence, the last wins: the defaults below < CONFIG <
the options and positional arguments < dotted `key=value` pairs. Options are what one types for one run
(`--out`, `--crops`) and sit above the file; `key=value` is the explicit spelling of a key and wins over both.
A recipe file may also hold the sections of another command (an ensemble recipe includes its `infer`
settings): they are checked and left out, so one file can describe the steps of a pipeline.

```bash
cellseg predict configs/infer/test_set.yaml runs/unet_3d crops=test out=preds/unet_3d.zarr infer.overlap=0.5
cellseg predict runs/unet_3d --crops val --out preds/unet_3d_val.zarr --tta 8      # the same keys as options
cellseg predict-ensemble configs/ensemble/eight.yaml crops=test out=ens.zarr --print-config   # the resolved config
```"""


def render_config(*, generator: str) -> str:
    """The whole docs/config.md."""
    roots = schema_roots()
    toc = [f"- [{_section_title(s, r).strip('`')}]({anchor(_section_title(s, r))})"
           for r in roots for s in sections(r) if leaf_fields(s.cls)]
    toc += ["- [Inference commands](#inference-commands)"]
    toc += [f"  - [{_job_title(c).replace('`', '')}]({anchor(_job_title(c))})" for c in job_roots()]
    toc += [f"  - [{s.prefix.rstrip('.')}]({anchor(s.prefix.rstrip('.'))})" for s in _job_sections()
            if leaf_fields(s.cls)]
    out = ["# Configuration reference", "",
           f"<!-- Generated from cellseg/config/schema.py, cellseg/config/inference.py, cellseg/config/jobs.py "
           f"and the model registry by `{generator}`; do not edit by hand. -->", "", INTRO, "", *toc,
           "- [`model.params` by architecture](#modelparams-by-architecture)", ""]
    for root in roots:
        out += _render_root(root)
    out += _render_jobs()
    out += _render_model_params()
    return "\n".join(out).rstrip() + "\n"


__all__ = ["all_roots", "config_keys", "field_docs", "job_roots", "parse_attributes", "render_config",
           "schema_roots", "undocumented_keys"]
