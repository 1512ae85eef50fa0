"""No judgement, no pass: a run whose kernel did not load, or that judged too few of its
planned cases, ends with exit status 4 (``core.errors.NotJudgedError``), says so in one
line, in its JUnit (an ``error`` testcase, never only skips) and in its job summary; the
summary lists why cases were skipped. Every check drives the real ``convmatrix run``."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from runner_helpers import KERNELS, TINY, convmatrix_cmd, run, runs

from convmatrix.core.errors import EXIT_CODES, NotJudgedError
from convmatrix.runners.run.account import DEFAULT_MIN_JUDGED, RunAccount, judgement

NOTHING_JUDGED = NotJudgedError.exit_code


def _run(tmp_path, kernel: str, *extra: str, matrix: str = "smoke"):
    url = f"sqlite:///{tmp_path / 'results.db'}"
    junit, summary = tmp_path / "junit.xml", tmp_path / "summary.md"
    args = ["run", "--matrix", matrix, "--kernel", kernel, "-n", "0", "--db", url,
            "--junit", str(junit), "--summary", str(summary), *extra]  # fmt: skip
    return run(convmatrix_cmd(*args), tmp_path), url, junit, summary


def _suite(junit) -> ET.Element:
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None
    return suite


def test_the_exit_table_holds_nothing_judged_as_4():
    assert NOTHING_JUDGED == 4 and "nothing judged" in EXIT_CODES[4]
    assert sorted(EXIT_CODES) == [0, 1, 2, 3, 4, 130]


def test_a_kernel_that_cannot_run_here_judges_nothing_and_exits_4(tmp_path):
    """``dao`` on a machine without causal_conv1d (or without CUDA): every case skipped."""
    done, url, junit, summary = _run(tmp_path, "dao")
    assert done.returncode == NOTHING_JUDGED, done.stdout + done.stderr
    out = done.stdout
    (line,) = [x for x in out.splitlines() if x.startswith("nothing judged:")]
    assert "0 of 35 planned cases judged, 7 needed (--min-judged 0.2)" in line
    assert "35 skipped: kernel 'dao' unavailable" in line
    assert "regressions: not scanned (nothing judged)" in out  # no baseline of skips
    suite = _suite(junit)
    errors = [t for t in suite.iter("testcase") if t.find("error") is not None]
    (error,) = errors
    assert error.get("name") == "nothing-judged"
    assert error.find("error").get("message").startswith("nothing judged: 0 of 35")
    assert (suite.get("errors"), suite.get("skipped"), suite.get("tests")) == ("1", "35", "36")
    text = summary.read_text()
    assert "(run 1) NOTHING JUDGED" in text and "**nothing judged: 0 of 35" in text
    assert "### Skipped cases (35)" in text
    assert "| 35 | kernel 'dao' unavailable: " in text  # each reason with its count
    (info,) = runs(url)
    assert info.status == "finished" and info.counts["skipped"] == 35  # recorded as it was
    report = run(convmatrix_cmd("report", "1", "--db", url, "--out", str(tmp_path)), tmp_path)
    assert report.returncode == NOTHING_JUDGED, report.stdout + report.stderr
    assert report.stdout.startswith("NOTHING JUDGED dao (run 1): 35 skipped")
    again = run(convmatrix_cmd("ci-report", "1", "--db", url, "--fail-on", "new-regressions"),
                tmp_path)  # fmt: skip
    assert again.returncode == NOTHING_JUDGED, again.stdout + again.stderr  # never a pass


@pytest.mark.parametrize(
    ("source", "why"),
    [
        ("import no_such_dependency_of_this_kernel\n", "ModuleNotFoundError: No module named"),
        ("raise AttributeError(\"module 'triton.language' has no attribute "
         "'make_block_ptr'\")\n", "AttributeError: module 'triton.language'"),
        ("import sys\nsys.exit(1)\n", "SystemExit: 1"),
    ],
)  # fmt: skip
def test_a_kernel_module_that_does_not_import_judges_nothing(tmp_path, source, why):
    """The spec names a module that exists but raises while importing (a missing dependency,
    a Triton that lost an API): exit 4 with the reason and an error testcase, not a traceback
    (exit 1, which ``git bisect`` takes for a bad commit) nor a usage error."""
    (tmp_path / "brokenk.py").write_text(source)
    done, _, junit, summary = _run(tmp_path, "brokenk:Kernel")
    assert done.returncode == NOTHING_JUDGED, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("convmatrix run: error: nothing judged: the kernel could not be ")
    assert why in line
    (case,) = _suite(junit).iter("testcase")
    assert case.get("name") == "nothing-judged" and why in case.find("error").get("message")
    assert "NOTHING JUDGED" in summary.read_text()


def test_a_kernel_module_that_is_not_there_is_still_a_usage_error(tmp_path):
    done, *_ = _run(tmp_path, "no_such_kernel_module:Kernel")
    assert done.returncode == 2 and "No module named 'no_such_kernel_module'" in done.stderr


def test_the_share_of_judged_cases_is_what_min_judged_asks(tmp_path):
    """``bad_kernels:ForwardOnly`` on tiny: its 3 fwd_bwd cases skipped (no backward), its
    update case judged: 1 of 4 passes the default share (0.2) and fails 0.5."""
    assert KERNELS.is_dir()
    done, *_ = _run(tmp_path, "bad_kernels:ForwardOnly", matrix=str(TINY))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "skipped 3: kernel 'forward_only' lacks feature(s) backward" in done.stdout
    strict, _, junit, _ = _run(
        tmp_path, "bad_kernels:ForwardOnly", "--min-judged", "0.5", matrix=str(TINY)
    )
    assert strict.returncode == NOTHING_JUDGED, strict.stdout + strict.stderr
    assert "nothing judged: 1 of 4 planned cases judged, 2 needed (--min-judged 0.5)" in (
        strict.stdout
    )
    assert any(t.get("name") == "nothing-judged" for t in _suite(junit).iter("testcase"))
    bad = run(convmatrix_cmd("run", "--matrix", "smoke", "--kernel", "torch", "--min-judged",
                             "1.5", "--no-db"), tmp_path)  # fmt: skip
    assert bad.returncode == 2 and "--min-judged 1.5: give a share from 0 to 1" in bad.stderr


def test_a_judged_failure_outranks_nothing_judged():
    """A failed case is a verdict: 1, whatever else was not judged; timeouts, errors and
    lost results judged nothing; a crash is the kernel's verdict."""

    def account(**counts: int) -> RunAccount:
        return RunAccount(1, "finished", counts, counts, planned=sum(counts.values()))

    assert account(failed=1, skipped=20).exit_code == 1
    assert account(crashed=1, timeout=3).exit_code == 1
    assert account(timeout=4).exit_code == NOTHING_JUDGED
    assert account(error=2, lost=2).exit_code == NOTHING_JUDGED
    assert account(passed=2, skipped=8).exit_code == 0  # 2 of 10 = the default 0.2
    assert account(passed=1, skipped=9).exit_code == NOTHING_JUDGED
    assert judgement({}, 0) is None  # nothing planned: nothing missing
    assert judgement({"passed": 7, "skipped": 28}, 35, DEFAULT_MIN_JUDGED) is None
    assert judgement({"passed": 6, "skipped": 29}, 35, DEFAULT_MIN_JUDGED) is not None
