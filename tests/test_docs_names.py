"""Every code name and repository path the docs and docstrings cite exists
(``docs_hooks/names_exist.py``; ``nox -s docs`` runs the same check before building)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs_hooks"))
import names_exist


def test_the_docs_name_only_what_exists() -> None:
    stale = names_exist.check()
    assert not stale, "stale names or paths:\n" + "\n".join(map(str, stale))


def test_the_check_finds_each_kind_of_stale_citation(tmp_path: Path) -> None:
    """A tree with one good and one stale citation of each kind: only the stale ones come back."""
    package = tmp_path / "convmatrix" / "core"
    package.mkdir(parents=True)
    (package.parent / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "real.py").write_text(
        '"""Module."""\n\nclass Thing:\n    size = 1\n\n    def grow(self):\n        pass\n'
    )
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("See `core.real.Thing.grow` and `core/real.py`.\n")
    (tmp_path / "docs" / "page.md").write_text(
        "Good: convmatrix.core.real.Thing.size, `convmatrix/core/real.py`.\n"
        "Stale: convmatrix.core.real.Gone, `core.real.Thing.shrink`, `core/unreal.py`,\n"
        "convmatrix.kernels.protocol, tests/test_nothing.py.\n"
        "```\nconvmatrix.core.inside_a_fence_still_counts\n```\n"
    )
    found = {s.name: s.why for s in names_exist.check(tmp_path)}
    assert set(found) == {
        "convmatrix.core.real.Gone",
        "convmatrix.core.real.Thing.shrink",
        "convmatrix/core/unreal.py",
        "convmatrix.kernels.protocol",
        "tests/test_nothing.py",
        "convmatrix.core.inside_a_fence_still_counts",
    }
    assert found["convmatrix.kernels.protocol"] == "moved to convmatrix.kernels.interface.protocol"
