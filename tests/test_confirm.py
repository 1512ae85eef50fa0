"""Confirmation before alerting, and the CI outputs of a real ``convmatrix run``: a failure
that does not reproduce on rerun is flaky and does not fail ``--fail-on new-regressions``; one
that does is confirmed and does; a nightly failing the same case again is not new; JUnit XML
and the markdown summary come from the run itself; a checkout with local changes at the recorded
commit is not the code the run tested. Real subprocesses, a real SQLite file, a real git
repository."""

from __future__ import annotations

import html
import os
import warnings
import xml.etree.ElementTree as ET

from kernel_repo import BAD, cli, nightly, repository
from runner_helpers import RESOURCES, TINY, TINY_L7, child_env, convmatrix_cmd, results, run, runs
from sqlalchemy.orm import Session

from convmatrix.cli import main
from convmatrix.db import open_database
from convmatrix.service.alerts import list_alerts
from convmatrix.service.regressions import list_regressions, regression_events

with warnings.catch_warnings():  # Starlette 1.x would rather have httpx2; httpx works
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from convmatrix.service.app import create_app


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


def _loaded(tmp_path, url, switch, state: str, *extra: str):
    switch.write_text(state)
    args = ["run", "--matrix", str(TINY), "--kernel", "service_kernels:Loaded", "-n", "1",
            "--case", TINY_L7, "--case-timeout", "3", "--db", url, *extra]  # fmt: skip
    return run(convmatrix_cmd(*args), tmp_path, CONVMATRIX_TEST_SWITCH=str(switch),
               CONVMATRIX_TEST_DELAY_S="6")  # fmt: skip


def test_a_timeout_under_load_raises_no_regression_and_a_hang_does(tmp_path):
    """A host busy once pushes the case past its 3 s limit: listed apart as infrastructure,
    no regression, no alert; the confirmation rerun (limit 4 x 3 s) passes it. A kernel that
    hangs times out again there: then, and only then, a new failure, confirmed."""
    url = f"sqlite:///{tmp_path / 'results.db'}"
    switch = tmp_path / "switch"
    assert _loaded(tmp_path, url, switch, "idle").returncode == 0
    busy = _loaded(tmp_path, url, switch, "busy", "--confirm", "--fail-on", "new-regressions")
    assert busy.returncode == 0, busy.stdout + busy.stderr
    assert "infrastructure: 1 cases not judged (1 timeout)" in busy.stdout
    assert "regressions: 0 new" in busy.stdout
    assert "limit 12 s a case" in busy.stdout and "0 reproduced" in busy.stdout
    assert _regressions(url) == []
    engine = open_database(url)
    with Session(engine) as session:
        assert list_alerts(session) == []
    engine.dispose()
    rerun = runs(url)[-1]
    assert (rerun.kind, rerun.label) == ("confirm", "confirm:2")
    assert results(url, rerun.id)[0].outcome == "passed"

    hang = _loaded(tmp_path, url, switch, "hang", "--confirm", "--fail-on", "new-regressions")
    assert hang.returncode == 1, hang.stdout + hang.stderr
    (reg,) = _regressions(url)
    assert (reg.kind, reg.state, reg.first_bad_run) == ("new_failure", "confirmed", 4)
    assert "timeout again on rerun with a 4x limit (12 s)" in reg.detail


STALE = RESOURCES / "matrices" / "stale.matrix.yaml"


def _stale(tmp_path, url, switch, state: str, *extra: str):
    switch.write_text(state)
    args = ["run", "--matrix", str(STALE), "--kernel", "service_kernels:StaleRead", "-n", "0",
            "--db", url, *extra]  # fmt: skip
    return run(convmatrix_cmd(*args), tmp_path, CONVMATRIX_TEST_SWITCH=str(switch))


def test_an_error_that_changes_by_itself_is_flaky_with_both_values(tmp_path):
    """An out-of-bounds read picks up garbage in run 2 only: y uses x25 of its bound usage of
    run 1, still within its bound, so the x16 rule flags an error regression of a passing
    case. The rerun at the same commit reads none: flaky, not confirmed, and the event and
    the outputs keep the run's values beside the rerun's."""
    url = f"sqlite:///{tmp_path / 'results.db'}"
    switch = tmp_path / "switch"
    assert _stale(tmp_path, url, switch, "good").returncode == 0
    done = _stale(tmp_path, url, switch, "once", "--confirm", "--fail-on", "new-regressions")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 new" in done.stdout and "0 confirmed, 1 flaky" in done.stdout
    (reg,) = _regressions(url)
    assert (reg.kind, reg.state) == ("error_regression", "flaky")
    (y,) = reg.outputs
    assert y["output"] == "y" and 16 * y["base_usage"] < y["usage"] <= 2.0  # in bound
    assert y["rerun"] == f"usage {y['base_usage']:.3g}"  # the rerun: the first run's value
    engine = open_database(url)
    with Session(engine) as session:
        last = regression_events(session, reg.id)[-1]
    engine.dispose()
    assert (last.by, last.to_state, last.run_id) == ("confirm", "flaky", 3)
    assert last.note == (
        f"rerun 3: did not reproduce: y {y['base_usage']:.3g} -> {y['usage']:.3g} in run 2; "
        f"rerun usage {y['base_usage']:.3g}"
    )
    with TestClient(create_app(url)) as client:  # the page shows both values
        page = client.get(f"/regressions/{reg.id}").text
    assert f"<td data-rerun>usage {y['base_usage']:.3g}</td>" in page
    assert html.escape(last.note, quote=False) in page


def test_a_change_the_baseline_shows_too_when_rerun_is_not_blamed_on_the_commit(tmp_path):
    """The issue's out-of-bounds read: the baseline's commit has it too, but its run read
    nothing. The head's rerun reads garbage again (against the stored baseline alone it would
    be confirmed), and so does the baseline's commit, rerun from a temporary worktree: no
    change of the commit, so flaky, with the run's and both reruns' values."""
    from test_regression_loop import _git

    repo = tmp_path / "kernel-repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    source = "from service_kernels import StaleRead\n\n\nclass Kernel(StaleRead):\n    name = 'k'\n"
    shas = []
    for text in (source, source + "# a commit that changes nothing here\n"):
        (repo / "stalek.py").write_text(text)
        _git(repo, "add", "stalek.py")
        _git(repo, "commit", "-q", "-m", f"commit {len(shas)}")
        shas.append(_git(repo, "rev-parse", "HEAD"))
    url = f"sqlite:///{tmp_path / 'results.db'}"
    switch = tmp_path / "switch"

    def nightly(sha: str, state: str, *extra: str):
        _git(repo, "checkout", "-q", sha)
        switch.write_text(state)
        args = ["run", "--matrix", str(STALE), "--kernel", "stalek:Kernel", "-n", "0",
                "--db", url, *extra]  # fmt: skip
        env = {"PYTHONPATH": f"{repo}{os.pathsep}{child_env()['PYTHONPATH']}",
               "CONVMATRIX_TEST_SWITCH": str(switch)}  # fmt: skip
        return run(convmatrix_cmd(*args), repo, **env)

    assert nightly(shas[0], "good").returncode == 0
    done = nightly(shas[1], "bad", "--confirm", "--fail-on", "new-regressions")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "(baseline rerun as run 4)" in done.stdout and "0 confirmed, 1 flaky" in done.stdout
    (reg,) = _regressions(url)
    assert (reg.kind, reg.state) == ("error_regression", "flaky")
    (y,) = reg.outputs
    assert y["rerun"] == y["rerun_base"] == f"usage {y['usage']:.3g}"  # garbage both times
    kinds = [(r.id, r.kind, r.label, r.kernel_commit) for r in runs(url)]
    assert kinds[2:] == [(3, "confirm", "confirm:2", shas[1]),
                         (4, "confirm", "confirm-base:2", shas[0])]  # fmt: skip


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
    (confirm,) = [r for r in runs(url) if r.label == "confirm:2"]
    assert (confirm.kind, confirm.kernel_commit, confirm.kernel_dirty) == ("confirm", bad, False)
