"""Command line ↔ config for the inference commands (`predict`, `predict-ensemble`, `ensemble`, `postprocess`).

Each of them reads `[CONFIG.yaml] [ITEM ...] [key=value ...] [--option ...]`, in any order:

- an argument ending in `.yaml`/`.yml` is the recipe file (`configs/infer/`, `configs/ensemble/`,
  `configs/postprocess/`);
- `key=value` (a dotted key, then `=`) overrides a config key, its value parsed as YAML;
- anything else is an ITEM: the run directory, the ensemble members or the probability store, as before.

Every option sets one config key (its help names it), so the resolved config is one typed object
(`cellseg.config.jobs`) whatever the spelling. Precedence, the last wins: the schema's defaults < CONFIG <
options and ITEMs < `key=value`. Options sit above the file because they are what a user types for one run
(`--out`, `--crops`); `key=value` is the explicit spelling of a key and wins over both.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

J = TypeVar("J")
KEY_DEST = "key:"  # dest prefix of an option that sets a config key: "key:infer.tta"
_OVERRIDE = re.compile(r"[A-Za-z_][\w.]*=")  # `infer.tta=1`; a path such as runs/a=b is not one
_CONFIG_SUFFIXES = (".yaml", ".yml")
PRECEDENCE = ("CONFIG is a YAML recipe (configs/infer/, configs/ensemble/, configs/postprocess/; with `include:`). "
              "Options and the other "
              "positional arguments override its keys, and dotted key=value pairs override those: defaults < CONFIG "
              "< options < key=value (each option's help names its key in brackets). --print-config prints the "
              "resolved config and exits.")


class IntermixedParser(argparse.ArgumentParser):
    """A parser whose positionals may come after options (`cellseg predict R --out P.zarr infer.tta=1`).

    argparse takes a `nargs="*"` positional from the first run of positionals only; `parse_known_intermixed_args`
    reads options first and gives every positional left over to it.
    """

    _intermixing = False

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
                         ) -> tuple[argparse.Namespace, list[str]]:
        """Options, then every positional (argparse's own two passes call back here, hence the flag)."""
        if self._intermixing:
            return super().parse_known_args(args, namespace)
        self._intermixing = True
        try:
            return super().parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False


@dataclass(frozen=True)
class Items:
    """What a command's ITEMs are: their metavar and the config key they set (a list when `many`)."""

    metavar: str
    key: str
    many: bool
    parser: argparse.ArgumentParser  # for the option that sets a missing required key


def add_command(subparsers: argparse._SubParsersAction, name: str, *, items: str, items_key: str, many: bool,
                items_help: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A sub-command parser taking `[CONFIG.yaml] [ITEM ...] [key=value ...]` and `--print-config`."""
    parser = subparsers.add_parser(name, **kwargs)
    parser.__class__ = IntermixedParser  # argparse builds sub-parsers itself; this only changes how they parse
    parser.add_argument("args", nargs="*", metavar=f"CONFIG.yaml|{items}|key=value",
                        help=f"a recipe file (.yaml/.yml), {items_help} [{items_key}], and dotted key=value "
                             "overrides")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
    parser.set_defaults(items=Items(items, items_key, many, parser))
    return parser


def option(parser: argparse.ArgumentParser | argparse._ArgumentGroup, *flags: str, key: str, help: str,
           **kwargs: Any) -> None:
    """An option that sets config key `key` when given (and leaves it to CONFIG or the default otherwise)."""
    if kwargs.get("action") is None and "choices" not in kwargs:
        kwargs.setdefault("metavar", key.rsplit(".", 1)[-1].upper())
    parser.add_argument(*flags, dest=KEY_DEST + key, default=argparse.SUPPRESS, help=f"{help} [{key}]", **kwargs)


def split_args(args: Sequence[str]) -> tuple[str | None, list[str], list[str]]:
    """(the config file, the `key=value` overrides, the other ITEMs), in the order given.

    Raises:
        ValueError: more than one config file.
    """
    configs = [a for a in args if a.endswith(_CONFIG_SUFFIXES)]
    if len(configs) > 1:
        raise ValueError(f"one CONFIG file at most, got {configs}; compose files with `include:` in one of them")
    overrides = [a for a in args if _OVERRIDE.match(a) and a not in configs]
    items = [a for a in args if a not in configs and a not in overrides]
    return (configs[0] if configs else None), overrides, items


def resolve(cls: type[J], args: argparse.Namespace) -> J:
    """The job config `cls` of a parsed command line (see the module docstring).

    Raises:
        ValueError: a missing required key (naming its option), bad keys or values, several ITEMs where one
            is expected.
        FileNotFoundError: no such CONFIG file.
    """
    from cellseg.cli._eras import era_names
    from cellseg.config.fields import check_eras
    from cellseg.config.jobs import merge_job
    from cellseg.config.load import from_dict

    config, overrides, items = split_args(args.args)
    spec: Items = args.items
    flags = {k.removeprefix(KEY_DEST): v for k, v in vars(args).items() if k.startswith(KEY_DEST)}
    if len(items) > 1 and not spec.many:
        raise ValueError(f"one {spec.metavar} expected, got {len(items)}: {items}")
    if spec.key == "ensemble.members" and len(items) == 1 and "ensemble.decisions" not in flags:
        from cellseg.infer.packaged import ensemble_decisions

        if (decided := ensemble_decisions(items[0])) is not None:  # an exported ensemble: its decisions name the runs
            flags["ensemble.decisions"], items = str(decided), []
    if items:
        flags[spec.key] = items if spec.many else items[0]
    data = merge_job(cls, config, overrides, flags=flags)
    _check_required(cls, data, spec)
    job = from_dict(cls, data)
    check_eras(job, era_names())  # the era keys name registered eras (`cellseg.config.fields`)
    return job


def _check_required(cls: type, data: dict[str, Any], spec: Items) -> None:
    """A required top-level key nobody set: name the option or argument that sets it."""
    ways = {a.dest.removeprefix(KEY_DEST): a.option_strings[0] for a in spec.parser._actions
            if a.dest.startswith(KEY_DEST) and a.option_strings}
    ways[spec.key] = spec.metavar
    for f in dataclasses.fields(cls):
        if f.name not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ValueError(f"no {f.name} given: pass {ways.get(f.name, f.name + '=...')} (or {f.name}=..., or "
                             "set it in CONFIG)")


def weights_flag(text: str) -> str | list[float]:
    """`--weights` text → "uniform", "auto", a weights.json path or one number per member ("3,1" → [3.0, 1.0]);
    anything else is passed on for `ensemble.weights` to reject with the valid choices."""
    if text in ("uniform", "auto") or text.endswith(".json"):
        return text
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        return text


def show_progress(args: argparse.Namespace, wanted: bool = True) -> bool:
    """Progress bars only on a terminal and without `-q`."""
    return wanted and sys.stderr.isatty() and not getattr(args, "quiet", False)


def print_config(job: Any) -> int:
    """`--print-config`: the resolved job config as YAML (loads back to an equal object)."""
    from cellseg.config.load import dump

    print(dump(job), end="")
    return 0
