"""How a process of convmatrix ends (``core.ending``): with its status, by ``os._exit``.

Each test runs a fresh interpreter: the end under test is the process's own.
"""

from __future__ import annotations

import subprocess
import sys

# A command's process as the console script starts it: main() owns the process.
COMMAND = """
import atexit, sys, threading, time
from concurrent.futures import ThreadPoolExecutor

pool = ThreadPoolExecutor(1)  # never shut down: its idle worker is a non-daemon thread
pool.submit(print, "pool ran", flush=True).result()

def late():
    time.sleep(0.5)
    print("thread joined", flush=True)

threading.Thread(target=late).start()
atexit.register(print, "hook ran")
sys.argv = ["convmatrix", *sys.argv[1:]]
from convmatrix.cli import main
main()
print("main returned")
"""

KERNEL_PROCESS = """
import atexit, threading, time
from convmatrix.core.ending import end_process
threading.Thread(target=time.sleep, args=(3600,)).start()
atexit.register(print, "hook ran")
print("flushed", end="")
end_process(5, ran_kernel=True)
"""

MAIN_NOT_OURS = """
import atexit, threading, time
from convmatrix.core.ending import end_when_main_returns
end_when_main_returns(7)
threading.Thread(target=time.sleep, args=(3600,)).start()
atexit.register(print, "hook ran")
print("main done")
"""

LIMIT_S = 120  # a process that waited on its sleeper would take an hour


def _python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", code, *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=LIMIT_S)


def test_a_command_ends_with_its_status_after_its_threads_and_hooks(tmp_path):
    """What Python does before its teardown still happens, in its order (a pool left open
    is stopped, not waited on for ever); the status is the command's (2: the database file
    is missing), and nothing after main() runs."""
    db = f"sqlite:///{tmp_path}/missing.db"
    done = _python(COMMAND, "history", "--dtype", "float32", "--db", db)
    assert done.returncode == 2, done.stderr
    assert "does not exist" in done.stderr
    assert done.stdout.splitlines() == ["pool ran", "thread joined", "hook ran"]


def test_a_process_that_ran_a_kernel_waits_on_nothing_it_left():
    done = _python(KERNEL_PROCESS)
    assert done.returncode == 5, done.stderr
    assert done.stdout == "flushed"  # flushed, though no newline ended it


def test_a_process_whose_main_is_not_ours_ends_when_that_main_returns():
    """An xdist worker's end: before Python joins the sleeper or runs the hook."""
    done = _python(MAIN_NOT_OURS)
    assert done.returncode == 7, done.stderr
    assert done.stdout == "main done\n"
