"""MkDocs hook: the "Getting started" page (``docs/getting-started.md``) is taken from the README.

The README's sections for a new user (install, the two commands, the walk-through, the CI
recipe) have one copy, in the README: at build time this hook replaces the placeholder page
with them (under the page's title, at their README levels) and rewrites the README's links
into ``docs/`` (``docs/x.md`` becomes ``x.md``). A section that is missing fails the build,
naming it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

PAGE = "getting-started.md"
TITLE = "Getting started"
SECTIONS = ("Install", "The two commands", "Five-minute walk-through", "CI recipe")

_LINK_INTO_DOCS = re.compile(r"\]\(docs/")


def readme_sections(text: str) -> dict[str, str]:
    """The README's ``## `` sections by title (each without its heading line). Headings inside
    fenced code blocks (shell comments) are not sections."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("## "):
            current = sections.setdefault(line[3:].strip(), [])
            continue
        if current is not None:
            current.append(line)
    return {title: "\n".join(lines).strip() for title, lines in sections.items()}


def render_page(readme: str) -> str:
    sections = readme_sections(readme)
    missing = [title for title in SECTIONS if title not in sections]
    if missing:
        raise LookupError(f"README.md has no section(s) {missing} for docs/{PAGE}")
    parts = [f"# {TITLE}", ""]
    for title in SECTIONS:
        body = _LINK_INTO_DOCS.sub("](", sections[title])
        parts += [f"## {title}", "", body, ""]
    return "\n".join(parts)


def on_page_markdown(markdown: str, page: Any, config: Any, **kwargs: Any) -> str:
    """MkDocs hook: replace the placeholder ``docs/getting-started.md``."""
    if page.file.src_uri != PAGE:
        return markdown
    readme = Path(config["config_file_path"]).parent / "README.md"
    try:
        return render_page(readme.read_text(encoding="utf-8"))
    except LookupError as exc:
        from mkdocs.exceptions import PluginError

        raise PluginError(str(exc)) from exc
