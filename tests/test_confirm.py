"""Confirmation before alerting, and the CI outputs of a real ``convmatrix run``: a failure
that does not reproduce on rerun is flaky and does not fail ``--fail-on new-regressions``; one
that does is confirmed and does; a nightly failing the same case again is not new; JUnit XML
and the markdown summary come from the run itself; a checkout with local changes at the recorded
commit is not the code the run tested. Real subprocesses, a real SQLite file, a real git
repository."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from kernel_repo import BAD, cli, nightly, repository
from runner_helpers import TINY, TINY_L7, convmatrix_cmd, run, runs
from sqlalchemy.orm import Session

from convmatrix.cli import main
from convmatrix.db import open_database
from convmatrix.service.regressions import list_regressions


def _regressions(url: str):
    engine = open_database(url)
    with Session(engine) as session:
        found = list_regressions(session)
    engine.dispose()
    return found


def _run(tmp_path, url, switch, state: str, *extra: str):
    switch.write_text(state)
    args = ["run", "--matrix", str(TINY), "--kernel", "service_kernels:Switched", "-n", "0",
            "--case", TINY_L7, "--db", url, *extra]  # fmt: skip
    return run(convmatrix_cmd(*args), tmp_path, CONVMATRIX_TEST_SWITCH=str(switch))


def test_a_failure_that_does_not_reproduce_is_flaky_and_does_not_fail(tmp_path):
    url = f"sqlite:///{tmp_path / 'results.db'}"
    switch = tmp_path / "switch"
    assert _run(tmp_path, url, switch, "good").returncode == 0
    done = _run(tmp_path, url, switch, "once", "--confirm", "--fail-on", "new-regressions")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "flaky" in done.stdout
    regs = _regressions(url)
    assert regs and all(r.state == "flaky" for r in regs)
    assert all(r.case_id.startswith(TINY_L7.rsplit("-", 1)[1]) for r in regs)
    confirm_run = runs(url)[-1]
    assert confirm_run.label == "confirm:2" and confirm_run.n_results == 1  # the case, by id


def test_a_failure_that_reproduces_is_confirmed_and_only_new_ones_fail(tmp_path):
    url = f"sqlite:///{tmp_path / 'results.db'}"
    switch = tmp_path / "switch"
    junit, summary = tmp_path / "junit.xml", tmp_path / "summary.md"
    assert _run(tmp_path, url, switch, "good").returncode == 0
    done = _run(
        tmp_path, url, switch, "bad", "--confirm", "--fail-on", "new-regressions",
        "--junit", str(junit), "--summary", str(summary), "--base-url", "http://ci:8000",
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    regs = _regressions(url)
    assert regs and all(r.state == "confirmed" for r in regs)
    suite = ET.parse(junit).getroot().find("testsuite")
    (case,) = suite.findall("testcase")
    assert case.get("name") == TINY_L7 and TINY_L7.endswith(case.get("id")[:6])
    failure = case.find("failure").text
    assert failure.startswith(f"FAILED {TINY_L7} [{case.get('id')}]")  # the verdict's lines
    text = summary.read_text()
    assert "new regressions**" in text and "(http://ci:8000/runs/2)" in text
    # The same failure the next night: known, not new, so the gate passes; the run still fails
    # without the gate.
    again = _run(tmp_path, url, switch, "bad", "--fail-on", "new-regressions")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "0 new" in again.stdout
    assert _run(tmp_path, url, switch, "bad").returncode == 1
    # Fixed: the regressions close by themselves.
    assert _run(tmp_path, url, switch, "good").returncode == 0
    assert {r.state for r in _regressions(url)} == {"fixed"}


def test_confirm_command_without_regressions(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'results.db'}"
    switch = tmp_path / "switch"
    assert _run(tmp_path, url, switch, "good").returncode == 0
    assert main(["confirm", "1", "--db", url]) == 0
    assert "no detected regression to confirm" in capsys.readouterr().out


# -- the code a confirmation reruns: the recorded commit, as it was ----------------------------


def test_confirm_refuses_a_dirty_checkout_at_the_recorded_commit(tmp_path):
    """The run tested commit ``bad`` as committed; the checkout stands at ``bad`` with a local
    change to the kernel's file: rerunning that is not rerunning what the run tested, so
    ``confirm`` refuses (exit 2, naming the commit and the local changes) and marks nothing;
    ``--checkout`` reruns the commit as committed, from a temporary worktree."""
    repo, good, bad = repository(tmp_path)
    url = f"sqlite:///{tmp_path / 'results.db'}"
    assert nightly(repo, good, url).returncode == 0
    broken = nightly(repo, bad, url)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    (repo / "repok.py").write_text(BAD + "# a local change, never committed\n")

    refused = cli(repo, "confirm", "2", "--db", url)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"at {bad} with local changes" in refused.stderr, refused.stderr
    assert {r.state for r in _regressions(url)} == {"detected"}
    assert len(runs(url)) == 2  # nothing was rerun

    rerun = cli(repo, "confirm", "2", "--checkout", "--db", url)
    assert rerun.returncode == 1, rerun.stdout + rerun.stderr  # reproduced
    assert {r.state for r in _regressions(url)} == {"confirmed"}
    confirm = runs(url)[-1]
    assert (confirm.kind, confirm.kernel_commit, confirm.kernel_dirty) == ("confirm", bad, False)
