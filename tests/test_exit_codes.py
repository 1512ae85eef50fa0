"""One table of exit statuses that every command follows (``core.errors.EXIT_CODES``): shown
by ``convmatrix --help`` and the README, and kept by the exit paths CI acts on: a database
unreachable at start and a machine that will not start a thread are infrastructure (3), in
one line. Every check is a real ``convmatrix`` process."""

from __future__ import annotations

import re
import socket
import sys
from pathlib import Path

import pytest
from runner_helpers import TINY, convmatrix_cmd, run

from convmatrix.core.errors import EXIT_CODES

README = Path(__file__).resolve().parent.parent / "README.md"
INFRASTRUCTURE = 3


def _closed_port() -> int:
    """A port nothing listens on (bound, then closed again)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_help_and_readme_show_the_one_table():
    done = run(convmatrix_cmd("--help"), Path.cwd())
    assert done.returncode == 0
    epilog = done.stdout.split("exit status (every command):", 1)[1]
    readme = README.read_text()
    table = readme.split("| status | meaning |", 1)[1].split("\n\n", 1)[0]
    for code, text in EXIT_CODES.items():
        first = text.split(":")[0]  # ok, failures, usage, infrastructure, nothing judged, ...
        assert re.search(rf"^\s*{code}\s+{re.escape(first)}", epilog, re.M), (code, epilog)
        assert f"| {code} | {first}" in table, (code, table)


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--matrix", str(TINY), "--kernel", "torch", "-n", "0"],
        ["history", "--dtype", "float32"],
        ["regressions"],
        ["ci-report", "latest"],
    ],
    ids=lambda argv: argv[0],
)
def test_a_database_unreachable_at_start_is_infrastructure(tmp_path, argv):
    """It was 1, the status of a failing case: CI could not tell a broken kernel from a
    database that is down."""
    url = f"postgresql+psycopg://nobody@127.0.0.1:{_closed_port()}/convmatrix"
    done = run(convmatrix_cmd(*argv, "--db", url), tmp_path)
    assert done.returncode == INFRASTRUCTURE, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"convmatrix {argv[0]}: error: cannot use database postgresql")
    assert "Connection refused" in line or "connection failed" in line


# Runs the CLI in a process that may start no thread once the run begins: every new thread
# asks for a 1 GiB stack under an address-space limit 512 MiB above what the process holds
# (what "can't start new thread" is on a machine out of threads or memory).
NO_THREADS = """
import resource, sys, threading
import torch, pytest, xdist.plugin
from convmatrix import cli
import convmatrix.commands.run, convmatrix.pipeline.run, convmatrix.runners.executors.xdist
import convmatrix.commands.explore, convmatrix.pipeline.explore
with open("/proc/self/status") as status:
    vm = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
threading.stack_size(1 << 30)
resource.setrlimit(resource.RLIMIT_AS, (vm + (512 << 20), vm + (512 << 20)))
sys.argv = ["convmatrix", *sys.argv[1:]]
sys.exit(cli.main())
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_a_machine_that_will_not_start_a_thread_is_infrastructure(tmp_path):
    """explore once ended with INTERNALERROR "can't start new thread" and exit 1, its "found
    a failure" status. A thread the harness cannot start is the machine's fault: 3, said in
    the run's last line, the cases errors of the harness (never a kernel's verdict)."""
    script = tmp_path / "no_threads.py"
    script.write_text(NO_THREADS)
    argv = ["run", "--matrix", str(TINY), "--kernel", "torch", "-n", "0", "--no-db"]
    done = run([sys.executable, str(script), *argv], tmp_path)
    assert done.returncode == INFRASTRUCTURE, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert "convmatrix run (not recorded) [interrupted]: 4 error" in lines
    assert "  infrastructure failure: the machine would not start a thread" in "\n".join(lines)
    url = f"sqlite:///{tmp_path / 'explore.db'}"
    argv = ["explore", "--kernel", "torch", "--budget", "60s", "-n", "0", "--db", url,
            "--out", str(tmp_path / "found.yaml")]  # fmt: skip
    done = run([sys.executable, str(script), *argv], tmp_path)
    assert done.returncode == INFRASTRUCTURE, done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("convmatrix explore: error: "), last
