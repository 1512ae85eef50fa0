"""MkDocs hook: the CLI reference page (``docs/cli.md``) is generated from the argument parsers.

At build time, for every name in ``convmatrix.cli.COMMANDS`` it calls
``convmatrix.cli.build_parser(name)``, takes that command's subparser and renders its usage,
description and every argument (flags, metavar, default, help) from argparse's own data, so
the page follows the code. ``docs/cli.md`` in the repository is only a placeholder.

``render_reference()`` and ``render_command()`` are importable without MkDocs (the tests use
them); ``on_page_markdown`` is the MkDocs hook.
"""

from __future__ import annotations

import argparse
import html
from typing import Any

PAGE = "cli.md"
USAGE_WIDTH = 100  # the usage blocks do not depend on the terminal that builds the site

_ENTITIES = {"_": "&#95;", "*": "&#42;", "|": "&#124;", "[": "&#91;", "]": "&#93;"}


def _escape(text: str) -> str:
    escaped = html.escape(text, quote=False)
    return "".join(_ENTITIES.get(char, char) for char in escaped)


def inline(text: str) -> str:
    """``text`` (a help string) as one line of inline Markdown that renders as written: HTML
    and Markdown characters escaped, safe in a table cell; `backticked` spans become code."""
    if text.count("`") % 2:  # an unmatched backtick: no code spans, every character as is
        rendered = _escape(text).replace("`", "&#96;")
    else:
        segments = text.split("`")
        rendered = "".join(
            f"<code>{_escape(s)}</code>" if i % 2 else _escape(s) for i, s in enumerate(segments)
        )
    return " ".join(rendered.split())


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def command_parser(name: str) -> argparse.ArgumentParser:
    """The subparser of ``name`` in ``build_parser(name)``: its own arguments defined."""
    from convmatrix import cli

    sub = _subparsers(cli.build_parser(name))
    if sub is None or name not in sub.choices:
        raise LookupError(f"convmatrix.cli.build_parser({name!r}) has no subparser {name!r}")
    return sub.choices[name]


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(prog=parser.prog, width=USAGE_WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def _code(text: str) -> str:
    return f"<code>{_escape(text)}</code>"


def _names(action: argparse.Action) -> str:
    names = action.option_strings or [action.metavar or action.dest]
    return ", ".join(_code(str(name)) for name in names)


def _metavar(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    formatter = argparse.HelpFormatter(prog=parser.prog)
    if action.option_strings:
        default = formatter._get_default_metavar_for_optional(action)
    else:
        default = formatter._get_default_metavar_for_positional(action)
    formatted = formatter._format_args(action, default)
    if not action.option_strings and formatted == (action.metavar or action.dest):
        return ""  # a plain positional: its name says it
    return _code(formatted)


def _default(action: argparse.Action) -> str:
    if action.required and action.option_strings:
        return "required"
    value = action.default
    if action.nargs == 0 or value is None or value is argparse.SUPPRESS or value in ([], ()):
        return ""
    return _code(str(value))


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help:
        return ""
    expanded = argparse.HelpFormatter(prog=parser.prog)._expand_help(action)
    return inline(expanded)


def _arguments_table(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.help is argparse.SUPPRESS:
            continue
        cells = (_names(action), _metavar(parser, action), _default(action), _help(parser, action))
        rows.append("| " + " | ".join(cells) + " |")
    if not rows:
        return []
    return ["| argument | value | default | description |", "|---|---|---|---|", *rows, ""]


def render_command(
    name: str, parser: argparse.ArgumentParser, summary: str | None = None, level: int = 2
) -> str:
    """Markdown for one (sub)command: heading, summary, description, usage, arguments, and
    its own subcommands one level down."""
    lines = [f"{'#' * level} `{parser.prog}`", ""]
    if summary:
        lines += [f"*{inline(summary)}*", ""]
    if parser.description:
        lines += [inline(parser.description), ""]
    lines += ["```text", _usage(parser), "```", ""]
    lines += _arguments_table(parser)
    sub = _subparsers(parser)
    if sub is not None:
        helps = {choice.dest: choice.help for choice in sub._choices_actions}
        for child_name, child in sub.choices.items():
            lines.append(render_command(child_name, child, helps.get(child_name), level + 1))
    return "\n".join(lines)


def render_reference() -> str:
    """The whole page: the command list, then every command of ``convmatrix.cli.COMMANDS``."""
    from convmatrix import cli
    from convmatrix.core.errors import EXIT_CODES

    lines = [
        "# CLI reference",
        "",
        "Generated when the site is built, from the argument parsers of `convmatrix.cli` "
        "(`docs_hooks/cli_reference.py`): every command, its usage and each argument as "
        "`convmatrix COMMAND --help` shows them.",
        "",
        "Exit status, the same for every command (`convmatrix.core.errors.EXIT_CODES`):",
        "",
        "| status | meaning |",
        "|---|---|",
        *(f"| {code} | {inline(text)} |" for code, text in EXIT_CODES.items()),
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    lines += [
        f"| [`{name}`](#convmatrix-{name}) | {inline(summary)} |"
        for name, summary in cli.COMMANDS.items()
    ]
    lines.append("")
    for name, summary in cli.COMMANDS.items():
        lines.append(render_command(name, command_parser(name), summary))
    return "\n".join(lines)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """MkDocs hook: replace the placeholder ``docs/cli.md`` with the generated reference."""
    if page.file.src_uri != PAGE:
        return markdown
    return render_reference()
