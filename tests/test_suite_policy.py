"""The suite cannot pass by skipping (tests/components.py): under CI a test whose declared
component is missing fails, naming the component and the test; locally it is skipped and the
reason printed. Each check runs a real inner pytest session with this project's conftest.py
and the plugins it registers.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import components
import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
LIMIT_S = 300  # an inner session takes a few seconds; a hung one fails instead of hanging

INNER = """
import pytest
from components import require


@pytest.mark.requires("chromium")
def test_marked_for_chromium():
    pass


@pytest.fixture
def server():
    require("postgresql")


def test_with_a_postgresql_fixture(server):
    pass


def test_needing_nothing():
    pass


def test_skipped_for_another_reason():
    pytest.skip("a CUDA device is present")
"""


def _pytest(cwd: Path, *args: str, ci: str | None, **env: str) -> subprocess.CompletedProcess:
    """``pytest -rfEs ARGS`` in ``cwd`` with ``CI=ci`` (unset: None), none of the outer
    session's variables, no PostgreSQL URL and no Chromium override unless given in ``env``."""
    dropped = ("CI", components.PG_ENV, components.CHROMIUM_ENV)
    environ = {
        k: v for k, v in os.environ.items() if not k.startswith("PYTEST_") and k not in dropped
    }
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), environ.get("PYTHONPATH")]))
    if ci is not None:
        environ["CI"] = ci
    environ.update(env)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rfEs", *args]
    return subprocess.run(
        cmd, cwd=cwd, env=environ, capture_output=True, text=True, timeout=LIMIT_S
    )


@pytest.fixture
def inner(tmp_path: Path) -> Path:
    """A directory with the project's conftest.py (verbatim) and the tests above."""
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_inner.py").write_text(INNER)
    return tmp_path


def _absent(tmp_path: Path) -> str:
    """A Chromium path sure to be missing: inside this test's own directory (a fixed path such
    as /nonexistent exists on some machines, and the tests then failed there)."""
    path = tmp_path / "absent" / "chromium"
    assert not path.exists()
    return str(path)


def _summary(out: str) -> str:
    """The last line: ``1 passed, 1 skipped, 2 errors in 0.12s``."""
    return out.strip().splitlines()[-1]


@pytest.mark.parametrize("ci", ["true"])
def test_under_ci_a_missing_component_fails_naming_it_and_the_test(inner, ci):
    absent = _absent(inner)
    done = _pytest(inner, ci=ci, CONVMATRIX_CHROMIUM=absent)
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert re.search(r"\b1 passed, 1 skipped, 2 errors\b", _summary(out)), out
    # the short summary names each test and its component
    assert re.search(
        r"ERROR test_inner.py::test_marked_for_chromium - Failed: declared component missing "
        r"under CI: chromium: no Chromium at " + re.escape(absent),
        out,
    ), out
    assert re.search(
        r"ERROR test_inner.py::test_with_a_postgresql_fixture - Failed: declared component "
        r"missing under CI: postgresql: CONVMATRIX_TEST_PG_URL is unset",
        out,
    ), out
    # one section lists the components missing and the tests that needed them
    section = out.split("declared components missing under CI ==", 1)[1]
    assert re.search(
        r"^chromium \(.*\): 1 test\(s\) failed for it: test_inner.py::"
        r"test_marked_for_chromium$",
        section,
        re.MULTILINE,
    ), section
    assert re.search(
        r"^postgresql \(.*\): 1 test\(s\) failed for it: test_inner.py::"
        r"test_with_a_postgresql_fixture$",
        section,
        re.MULTILINE,
    ), section
    # a skip for another reason than a missing component stays a skip
    assert re.search(r"SKIPPED \[1\] test_inner.py:\d+: a CUDA device is present", out), out


@pytest.mark.parametrize("ci", [None, "false"])
def test_locally_a_missing_component_skips_with_the_reason(inner, ci):
    absent = _absent(inner)
    done = _pytest(inner, ci=ci, CONVMATRIX_CHROMIUM=absent)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert re.search(r"\b1 passed, 3 skipped\b", _summary(out)), out
    assert f"needs chromium: no Chromium at {absent} (apt-get install chromium" in out
    assert "needs postgresql: CONVMATRIX_TEST_PG_URL is unset" in out
    assert "declared components missing" not in out


def test_under_ci_present_components_pass(inner):
    """The probes only look (a file where Chromium should be, a URL that is set): the inner
    tests use neither."""
    done = _pytest(
        inner,
        ci="true",
        CONVMATRIX_CHROMIUM=sys.executable,
        CONVMATRIX_TEST_PG_URL="postgresql+psycopg://nobody@127.0.0.1:9/none",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"\b3 passed, 1 skipped\b", _summary(done.stdout)), done.stdout


@pytest.mark.parametrize(
    ("args", "env", "component", "n"),
    [
        (["tests/test_browser.py"], {"CONVMATRIX_CHROMIUM": "ABSENT"}, "chromium", 4),
        (["tests/test_db_schema.py", "-m", "postgres"], {}, "postgresql", 4),
    ],
    ids=["browser", "postgresql"],
)
def test_the_suites_own_tests_fail_under_ci_without_their_component(
    tmp_path, args, env, component, n
):
    """The issue's own check, on the real test files: with the component made unavailable,
    CI=true fails every test that needs it, naming them; nothing else runs first."""
    env = {k: _absent(tmp_path) if v == "ABSENT" else v for k, v in env.items()}
    done = _pytest(ROOT, *args, "-n", "0", ci="true", **env)
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    named = re.findall(
        rf"^ERROR (tests/\S+) - Failed: declared component missing under CI: {component}: ",
        out,
        re.MULTILINE,
    )
    assert len(named) == n and all(nodeid.startswith(args[0]) for nodeid in named), out
    assert re.search(rf"\b{n} errors\b", _summary(out)), out
    assert re.search(rf"^{component} \(.*\): {n} test\(s\) failed for it", out, re.MULTILINE), out


def test_an_unknown_component_is_an_error_not_a_skip():
    with pytest.raises(ValueError, match="'chromeium' is not a declared component"):
        components.require("chromeium")
    with pytest.raises(ValueError, match="'pg' is not a declared component"):
        components.missing("pg", "no server")


@pytest.mark.parametrize(
    ("value", "ci"),
    [(None, False), ("", False), ("0", False), ("false", False), ("False", False),
     ("no", False), ("off", False), ("true", True), ("1", True), ("yes", True)],
)  # fmt: skip
def test_what_counts_as_ci(monkeypatch, value, ci):
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    assert components.under_ci() is ci


def test_no_test_skips_on_a_missing_import():
    """Declared test dependencies are plain imports (missing, they fail collection); the
    components a test can only find at run time go through tests/components.py."""
    needle = "importor" + "skip"  # spelled apart so that this file does not match itself
    found = [
        f"{path.name}:{n}"
        for path in sorted(TESTS.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if needle in line
    ]
    assert found == []


def test_nox_prints_skip_reasons():
    """``nox -s tests`` shows why each test was skipped (and lists failures and errors)."""
    noxfile = (ROOT / "noxfile.py").read_text()
    assert '"pytest", "-n", workers, "-rfEs",' in noxfile


@pytest.mark.parametrize(("given", "seen"), [(None, "true"), ("false", "false"), ("1", "1")])
def test_the_ci_script_sets_ci_unless_the_runner_did(given, seen):
    """``.ci/run`` on a runner that does not set CI must still fail on missing components:
    its opening lines (up to the export, before anything is installed) run here."""
    script = (ROOT / ".ci" / "run").read_text().splitlines()
    head = script[: next(i for i, line in enumerate(script) if line.startswith("export CI=")) + 1]
    environ = {k: v for k, v in os.environ.items() if k != "CI"}
    if given is not None:
        environ["CI"] = given
    cmd = ["bash", "-c", "\n".join([*head[1:], 'printf %s "$CI"']), str(ROOT / ".ci" / "run")]
    done = subprocess.run(cmd, env=environ, capture_output=True, text=True, timeout=LIMIT_S)
    assert done.returncode == 0, done.stderr
    assert done.stdout == seen
