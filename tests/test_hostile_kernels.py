"""Kernels that attack the process they run in (issue 23), through a real ``convmatrix run``.

``hostile_kernels:Hostile`` attacks once per sequence length of ``hostile.matrix.yaml``
(bfloat16 cases with a final state): a float64, ``meta`` or numpy final state, an exception
whose ``__str__`` raises, ``torch.set_default_device("meta")``, ``sys.setrecursionlimit(60)``,
an ANSI-coloured message and warning, SIGTERM ignored, a setsid daemon, a numpy y from
``fwd_bwd``. Each attack must be the kernel's own failure (or a note on its case) and leave
every later case unharmed; no escape sequence may reach the terminal; JUnit must parse. Then
the single-process run against kernels that leave threads, hold the GIL, ignore SIGTERM or
print megabytes, and a kernel that writes outside its inputs only during property checks.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from runner_helpers import (
    RESOURCES,
    TINY,
    alive,
    child_env,
    convmatrix_cmd,
    pytest_cmd,
    results,
    run,
    runs,
)

from convmatrix.matrix import expand_matrix, load_matrix

HOSTILE = RESOURCES / "matrices" / "hostile.matrix.yaml"
FAULTS = RESOURCES / "matrices" / "faults.matrix.yaml"
# seqlen -> (outcome, words its message must contain)
EXPECTED = {
    3: ("failed", "F has dtype torch.float64, the case's input has torch.bfloat16"),
    4: ("failed", "F is on meta"),
    5: ("failed", "F is a ndarray, not a tensor"),
    6: ("failed", "kernel raised StrRaises: <StrRaises whose str() raised RuntimeError>"),
    7: ("passed", "kernel 'hostile' changed the process's default device (meta"),
    8: ("passed", ""),
    9: ("passed", "recursion limit (60, restored to"),
    10: ("failed", "kernel raised ValueError: \x1b[31mboom"),  # stored as raised
    11: ("passed", "SIGTERM handler (ignored, restored to"),
    12: ("passed", "ended 1 process(es)"),
    13: ("failed", "forward returned ndarray, not a tensor"),
    16: ("passed", ""),
    17: ("passed", ""),
    18: ("passed", ""),
}


@pytest.mark.parametrize("workers", ["0", "2"])
def test_hostile_kernels_fail_themselves_and_leave_the_process_as_it_was(
    tmp_path, sqlite_url, workers
):
    daemon = tmp_path / "daemon.pid"
    junit = tmp_path / "junit.xml"
    args = ["run", "--matrix", str(HOSTILE), "--kernel", "hostile_kernels:Hostile"]
    done = run(
        convmatrix_cmd(*args, "-n", workers, "--db", sqlite_url, "--junit", str(junit)),
        tmp_path,
        HOSTILE_DAEMON_PID=str(daemon),
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "Traceback" not in out and "INTERNALERROR" not in out and "harness error" not in out
    # no escape sequence, bell or carriage return reached the terminal: shown escaped
    assert not re.search(r"[\x1b\x07\r\x9b]", out), repr(out[-3000:])
    assert "\\x1b[31mboom" in out, out[-3000:]
    if workers == "0":  # pytest's warnings summary (under xdist the workers' are not shown)
        assert "kernel warning \\x1b[31mboom" in out, out[-3000:]

    (info,) = runs(sqlite_url)
    assert info.status == "finished" and info.n_planned == len(EXPECTED)
    by_seqlen = {r.case.seqlen: r for r in results(sqlite_url, info.id)}
    assert set(by_seqlen) == set(EXPECTED)
    for seqlen, (outcome, words) in EXPECTED.items():
        got = by_seqlen[seqlen]
        assert got.outcome == outcome, (seqlen, got.message)
        assert words in (got.message or ""), (seqlen, got.message)
    pid = int(daemon.read_text())
    assert not alive(pid), "a setsid + double-fork daemon outlived its case"

    for argv in (["regressions", "show", "1"], ["regressions"], ["report", "latest"]):
        shown = run(convmatrix_cmd(*argv, "--db", sqlite_url), tmp_path)
        text = shown.stdout + shown.stderr
        assert not re.search(r"[\x1b\x07\r\x9b]", text), (argv, repr(text[-2000:]))
        if argv[0] == "regressions":  # the kernel's message, shown escaped
            assert "\\x1b[31mboom" in text, (argv, text[-2000:])

    tree = ET.parse(junit)  # a standard XML parser takes it, ANSI colours and all
    failures = tree.getroot().iter("failure")
    assert any("\\x1b[31mboom" in (f.get("message") or "") + (f.text or "") for f in failures)


def test_a_single_process_run_whose_kernel_leaves_threads_exits_with_its_status(tmp_path):
    """A non-daemon thread sleeping an hour and an atexit hook doing the same hung the
    process after its summary: the CI job hung and the exit status was lost."""
    args = ["run", "--matrix", str(FAULTS), "--kernel", "hostile_kernels:LeavesThreads"]
    start = time.monotonic()
    done = run(convmatrix_cmd(*args, "-n", "0", "--no-db"), tmp_path)  # LIMIT_S: 300 s
    assert done.returncode == 0, done.stdout + done.stderr
    assert time.monotonic() - start < 120
    assert "exiting without waiting for 1 thread(s) the kernel left running (kernel-sleeper)" in (
        done.stderr
    ), done.stderr
    assert "12 passed" in done.stdout


@pytest.mark.parametrize("workers", ["0", "1"])
def test_the_process_that_ran_a_kernel_ends_without_running_its_hooks(tmp_path, workers):
    """The process that ran the kernel (-n 0: the command's; -n 1: the worker) ends with
    os._exit once its work is delivered (core.ending): the kernel's atexit hook never runs.
    A worker used to tear the interpreter down (0.55 s with torch) while the controller
    waited, and to wait on a thread the kernel left until xdist killed it 10 s later."""
    mark = tmp_path / "hook-ran"
    args = ["run", "--matrix", str(FAULTS), "--kernel", "hostile_kernels:LeavesAHook"]
    done = run(
        convmatrix_cmd(*args, "-n", workers, "--no-db"), tmp_path, HOSTILE_HOOK_MARK=str(mark)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "12 passed" in done.stdout
    assert not mark.exists(), mark.read_text()


def test_a_kernel_holding_the_gil_leaves_one_clear_line(tmp_path, sqlite_url):
    """A hang that holds the GIL: no Python-level watchdog runs, faulthandler ends the
    process (1 s limit + 15 s grace). That gave no output at all; now one line names the
    case, faulthandler's traceback file and the run to resume, and the run shows abandoned."""
    args = ["run", "--matrix", str(FAULTS), "--kernel", "hostile_kernels:HoldsTheGIL", "-n", "0"]
    # only the hanging case: on a loaded host an ordinary case can outlast the 1 s limit too,
    # and its timeout would be a different line than the one this test is about
    (hanging,) = [c.id for c in expand_matrix(load_matrix(str(FAULTS))).cases if c.seqlen == 12]
    args += ["--case", hanging]
    done = run(convmatrix_cmd(*args, "--case-timeout", "1", "--db", sqlite_url), tmp_path)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if "the run's process ended" in line]
    assert len(lines) == 1, done.stdout + done.stderr
    (line,) = lines
    assert "during case fwd-K4-L12-" in line and "faulthandler ended it" in line, line
    trace = re.search(r"traceback is in (\S+?);", line)
    assert trace, line
    path = Path(trace.group(1))
    try:
        text = path.read_text()
        assert "Timeout" in text and "hostile_kernels.py" in text, text
    finally:
        path.unlink()
    (info,) = runs(sqlite_url)
    assert f"convmatrix run --resume {info.id}" in line
    assert info.shown_status.startswith("abandoned"), info.shown_status


def test_a_kernel_ignoring_sigterm_cannot_keep_the_run_from_stopping(tmp_path, sqlite_url):
    ready = tmp_path / "ready"
    args = ["run", "--matrix", str(FAULTS), "--kernel", "hostile_kernels:IgnoresSigterm"]
    proc = subprocess.Popen(
        convmatrix_cmd(*args, "-n", "0", "--db", sqlite_url),
        cwd=tmp_path,
        env=child_env(HOSTILE_READY=str(ready)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not ready.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert ready.exists(), "the kernel never ran"
        time.sleep(1.0)  # into the next case: the SIGTERM handler must be back by now
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, out + err
    (info,) = runs(sqlite_url)
    assert info.status == "interrupted"


def test_a_kernels_output_is_bounded_before_it_reaches_pytest_and_xdist(tmp_path):
    """4 MB of coloured output per case (half through sys.stdout, half through fd 1) went
    whole into each report, and from every xdist worker to the controller; now each case
    keeps the first and the last 16 KiB and says how much was cut."""
    args = [str(FAULTS), "--kernel", "hostile_kernels:Chatty", "--no-db", "-n", "1"]
    done = run(pytest_cmd(*args, "--tb=short", "-p", "no:warnings"), tmp_path, CHATTY_MB="4")
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    assert "cut here" in out and "bytes of the kernel's output" in out, out[-3000:]
    assert "first line of the kernel" in out and "last line of the kernel" in out
    assert len(out) < 400_000, len(out)  # the failed case's report: 2 x 2 x 16 KiB at most


def test_guards_hold_during_the_property_checks_too(tmp_path, sqlite_url):
    """A kernel correct on its main call writes outside its input during the chunk
    consistency check's calls: only the main call was guarded, so it passed."""
    args = ["run", "--matrix", str(TINY), "--kernel", "hostile_kernels:WritesOutsideInChecks"]
    done = run(convmatrix_cmd(*args, "-n", "0", "--db", sqlite_url), tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    (info,) = runs(sqlite_url)
    checked = [r for r in results(sqlite_url, info.id) if r.case.op == "fwd_bwd"]
    assert checked and all(r.outcome == "failed" for r in checked)
    for r in checked:
        chunk = next(p for p in r.properties if p.name == "chunk_consistency")
        assert not chunk.passed and "guards broken by this check's calls" in chunk.detail
        assert "outside the view were written" in chunk.detail, chunk.detail


def test_a_single_process_timeout_exits_1_and_says_how_to_go_on(tmp_path, sqlite_url):
    """A -n 0 run whose case overran its limit exited 70 (the watchdog's worker status,
    documented nowhere); it is a run stopped early: 1, with the line that resumes it."""
    args = ["run", "--matrix", str(FAULTS), "--kernel", "fault_kernels:SlowPasses", "-n", "0"]
    done = run(convmatrix_cmd(*args, "--case-timeout", "1", "--db", sqlite_url), tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "the run stopped here" in out and "convmatrix run --resume" in out, out
    assert "the run's process ended" not in out, out  # the witness stays quiet: it was told
    (info,) = runs(sqlite_url)
    assert info.status == "interrupted" and info.counts["timeout"] == 1
