"""A matrix file restricted to some of its cases: the original text plus a top-level
``cases:`` list (what ``convmatrix adequacy --minimize`` writes).

The suites, their strategies and seeds stay as they were, so every listed case expands to the
same case with the same id; ``cases:`` then keeps only those (``convmatrix.matrix.expand``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["with_cases"]

_CASES_BLOCK = re.compile(r"^cases:[^\n]*\n(?:[ \t]+[^\n]*\n|[ \t]*\n)*", re.MULTILINE)
_NAME_LINE = re.compile(r"^name:[^\n]*$", re.MULTILINE)


def with_cases(text: str, name: str, case_ids: Sequence[str], comment: str = "") -> str:
    """``text`` (a matrix file) named ``name`` and keeping only ``case_ids``; any earlier
    ``cases:`` list is replaced. ``comment`` lines go on top, each prefixed with ``# ``."""
    body = _CASES_BLOCK.sub("", text if text.endswith("\n") else text + "\n")
    if _NAME_LINE.search(body):
        body = _NAME_LINE.sub(f"name: {name}", body, count=1)
    else:
        body = f"name: {name}\n" + body
    head = "".join(f"# {line}\n" for line in comment.splitlines())
    listed = "".join(f"  - '{case_id}'\n" for case_id in case_ids)
    return f"{head}{body}\ncases:\n{listed}"
