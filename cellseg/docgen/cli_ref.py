"""docs/cli.md: every `cellseg` sub-command, read from the argparse parsers `cellseg.cli.build_parser` builds.

Commands are discovered the way the CLI discovers them, so a new module in `cellseg/cli/` appears after
regeneration. The page is rendered from the parser objects (option strings, metavars, choices and
help), not from `format_help()`, whose wrapping follows the terminal width and whose layout changes
between Python versions. Default values are not rendered (some are computed from the machine, e.g. the
number of CPU cores); help strings state them in words, so the page is the same on every machine.

argparse keeps its actions and sub-parsers in underscore attributes (`_actions`, `_SubParsersAction`,
`_choices_actions`); they have been stable since Python 3.2 and are the only way to walk a parser.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from cellseg.docgen.markdown import anchor, code, code_block, escape, paragraphs, table

USAGE_WIDTH = 100  # characters per line of the usage blocks
_RAW_FORMATTERS = (argparse.RawDescriptionHelpFormatter, argparse.RawTextHelpFormatter)


@dataclass(frozen=True)
class Command:
    """One (sub-)command: `path` is the words after `cellseg`, e.g. ("show", "crop")."""

    path: tuple[str, ...]
    summary: str
    parser: argparse.ArgumentParser
    aliases: tuple[str, ...] = ()

    @property
    def title(self) -> str:
        return " ".join(("cellseg", *self.path))


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[Command]:
    """Every sub-command under `parser`, depth first, in registration order (aliases folded in)."""
    action = _subparsers(parser)
    if action is None:
        return []
    summaries = {a.dest: a.help or "" for a in action._choices_actions}
    seen: dict[int, Command] = {}
    for name, sub in action.choices.items():
        if id(sub) in seen:  # an alias of a command already listed
            first = seen[id(sub)]
            seen[id(sub)] = Command(first.path, first.summary, first.parser, (*first.aliases, name))
        else:
            seen[id(sub)] = Command((*path, name), summaries.get(name, ""), sub)
    out = []
    for command in seen.values():
        out += [command, *walk(command.parser, command.path)]
    return out


def commands() -> list[Command]:
    """Every `cellseg` command and sub-command that exists now."""
    from cellseg.cli import build_parser

    return walk(build_parser())


# ---------------------------------------------------------------------------------------------- arguments


def metavar(action: argparse.Action) -> str:
    """What follows the option string: `DIR`, `{a,b}`, `[N]`, `A [A ...]`, or "" for a flag."""
    if action.nargs == 0:
        return ""
    if action.metavar is not None:
        name = action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar)
    elif action.choices is not None:
        name = "{" + ",".join(str(c) for c in action.choices) + "}"
    else:
        name = action.dest if not action.option_strings else action.dest.upper()
    nargs = action.nargs
    if nargs == "?":
        return f"[{name}]"
    if nargs == "*":
        return f"[{name} ...]"
    if nargs == "+":
        return f"{name} [{name} ...]"
    if isinstance(nargs, int):
        return " ".join([name] * nargs)
    return name


def _is_positional_optional(action: argparse.Action) -> bool:
    return not action.option_strings and action.nargs in ("?", "*")


def expand_help(action: argparse.Action, prog: str) -> str:
    """argparse's `%(default)s`-style expansion of a help string."""
    params = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
    params = {k: getattr(v, "__name__", v) for k, v in params.items()}
    if params.get("choices") is not None:
        params["choices"] = ", ".join(str(c) for c in params["choices"])
    return (action.help or "") % dict(params, prog=prog)


def is_required(action: argparse.Action) -> bool:
    return action.required or (not action.option_strings and not _is_positional_optional(action))


def argument_rows(parser: argparse.ArgumentParser) -> list[list[str]]:
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction) or action.help is argparse.SUPPRESS:
            continue
        name = ", ".join(action.option_strings) or ""
        shown = f"{name} {metavar(action)}".strip()
        text = escape(expand_help(action, parser.prog))
        rows.append([code(shown), f"**required** — {text}" if is_required(action) and action.option_strings else text])
    return rows


def usage(command_words: str, parser: argparse.ArgumentParser) -> str:
    """A usage synopsis wrapped at `USAGE_WIDTH`, never inside one item."""
    options, positionals = [], []  # options first, as argparse prints them
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.help is argparse.SUPPRESS:
            continue
        if isinstance(action, argparse._SubParsersAction):
            positionals.append("COMMAND ...")
        elif not action.option_strings:
            positionals.append(metavar(action))
        else:
            text = f"{action.option_strings[0]} {metavar(action)}".strip()
            options.append(text if action.required else f"[{text}]")
    lines, line = [], command_words
    for item in options + positionals:
        if len(line) + 1 + len(item) > USAGE_WIDTH and line.strip() != command_words:
            lines.append(line)
            line = " " * len(command_words)
        line = f"{line} {item}"
    return "\n".join([*lines, line])


# ---------------------------------------------------------------------------------------------- rendering


def _description(parser: argparse.ArgumentParser) -> list[str]:
    if not parser.description:
        return []
    if issubclass(parser.formatter_class, _RAW_FORMATTERS):
        return [code_block(parser.description), ""]
    return [p for para in paragraphs(parser.description) for p in (escape(para), "")]


def render_command(command: Command) -> list[str]:
    parser = command.parser
    out = [f"## `{command.title}`", ""]
    if command.summary:
        out += [escape(command.summary[0].upper() + command.summary[1:]) + ".", ""]
    if command.aliases:
        out += ["Aliases: " + ", ".join(code(a) for a in command.aliases) + ".", ""]
    out += [code_block(usage(command.title, parser)), "", *_description(parser)]
    rows = argument_rows(parser)
    if rows:
        out += [table(["argument", "description"], rows), ""]
    sub = _subparsers(parser)
    if sub is not None:
        names = [n for n in sub.choices if n in {a.dest for a in sub._choices_actions}]
        out += ["Sub-commands: " + ", ".join(f"[{code(n)}]({anchor(f'{command.title} {n}')})" for n in names) + ".", ""]
    if parser.epilog:
        out += [code_block(parser.epilog), ""]
    return out


def render_cli(*, generator: str) -> str:
    """The whole docs/cli.md."""
    from cellseg.cli import build_parser

    top = build_parser()
    cmds = walk(top)
    summary = [[f"[{code(c.title)}]({anchor(c.title)})", escape(c.summary)] for c in cmds]
    out = ["# Command-line reference", "",
           f"<!-- Generated from the argparse parsers of cellseg/cli/ by `{generator}`; do not edit by hand. -->",
           "", "Every command also prints this with `--help`. Global options go before the command "
               "(`cellseg -v train ...`).", "",
           code_block(usage("cellseg", top)), "",
           table(["argument", "description"], argument_rows(top)), "",
           table(["command", "what it does"], summary), ""]
    for command in cmds:
        out += render_command(command)
    return "\n".join(out).rstrip() + "\n"
