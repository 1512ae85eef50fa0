"""The docs site's CLI reference (docs_hooks/cli_reference.py) is generated from the parsers:
every command is on the page, and what a parser holds is what the page says. No MkDocs build
here (``nox -s docs`` does that)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from convmatrix import cli

HOOK = Path(__file__).parent.parent / "docs_hooks" / "cli_reference.py"


@pytest.fixture(scope="module")
def hook():
    spec = importlib.util.spec_from_file_location("cli_reference", HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def page(hook) -> str:
    return hook.render_reference()


def _section(page: str, command: str) -> str:
    start = page.index(f"\n## `convmatrix {command}`\n")
    end = page.find("\n## ", start + 1)
    return page[start : end if end >= 0 else len(page)]


def test_every_command_has_a_section(page):
    headings = re.findall(r"^## `convmatrix ([a-z-]+)`$", page, flags=re.M)
    assert headings == list(cli.COMMANDS)
    for name in cli.COMMANDS:
        assert f"](#convmatrix-{name})" in page  # the command table links each section


def test_run_section_lists_its_options(page):
    run = _section(page, "run")
    assert "usage: convmatrix run" in run
    for flag in ("--matrix", "--kernel", "-n", "--db", "--report", "--shard", "--fail-on"):
        assert f"| <code>{flag}</code>" in run, flag
    # choices, defaults and help come from argparse's own data
    assert "bound, threshold, framework, threshold&#95;or&#95;framework" in run
    executor = "| <code>--executor</code>, <code>--engine</code> | <code>{xdist,ray}</code> |"
    assert f"{executor} <code>xdist</code> |" in run


def test_nested_subcommands_are_rendered(page):
    regressions = _section(page, "regressions")
    for action in ("scan", "set", "show"):
        assert f"### `convmatrix regressions {action}`" in regressions
    assert "### `convmatrix db upgrade`" in _section(page, "db")


def test_the_page_follows_the_parser_object(hook):
    """An argument added to a parser object appears when that object is rendered, with its
    metavar, default and help; the parser from build_parser() does not have it."""
    parser = hook.command_parser("history")
    parser.add_argument(
        "--fake-docs-flag", metavar="WIDGET", default="w1", help="a <fake> flag for `docs`"
    )
    text = hook.render_command("history", parser)
    row = next(line for line in text.splitlines() if line.startswith("| <code>--fake-docs-flag"))
    assert row == (
        "| <code>--fake-docs-flag</code> | <code>WIDGET</code> | <code>w1</code> "
        "| a &lt;fake&gt; flag for <code>docs</code> |"
    )
    assert "[--fake-docs-flag WIDGET]" in text  # the usage block too
    assert "--fake-docs-flag" not in hook.render_command("history", hook.command_parser("history"))


def test_required_options_and_escaping(hook):
    text = hook.render_command("history", hook.command_parser("history"))
    assert "| <code>--dtype</code> | <code>DTYPE</code> | required |" in text
    assert hook.inline("a|b *c* _d_ <e> `f_g`") == (
        "a&#124;b &#42;c&#42; &#95;d&#95; &lt;e&gt; <code>f&#95;g</code>"
    )
    assert hook.inline("one ` unmatched") == "one &#96; unmatched"


def test_the_readme_stays_a_page_for_users():
    # Measured tables and reference material live in docs/ (issue: the README was a lab
    # notebook of 514 lines); the README keeps install, the two commands, a walk-through.
    lines = (HOOK.parent.parent / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250
