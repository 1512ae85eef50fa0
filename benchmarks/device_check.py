"""The device check: everything convmatrix does on a GPU, in one bounded command.

    python benchmarks/device_check.py [--wheels .whl] [--out device-check] [--budget-s 540]
    python benchmarks/device_check.py --dry-run        # the same script on this CPU

On the lent GPU machine (docs/devices.md: no network; torch, triton, pytest, xdist, jinja2,
pyyaml and nvcc there) it installs the carried wheels (``device_wheels.py`` prepares them
here), prints the device, runs ``selfcheck`` with the reference on the device, starts building
Dao's ``causal-conv1d`` from its sdist with the machine's nvcc in the background (bounded in
time), runs ``smoke``, ``nightly`` and ``production`` with ``torch``, ``tiled`` and ``fla``
(Triton natively on the GPU) on ``cuda``, the ``perf`` matrix (CUDA events, efficiency
against the measured copy bandwidth), then ``dao`` over ``nightly`` and a ``dao-parity``
sample when the build made it, and writes ``summary.json`` and ``summary.html`` into
``--out`` with the run reports beside them. Every step has its share of ``--budget-s`` (one
device command runs at most 10 minutes); a step that runs out is recorded as such, never
hangs the check.

``--dry-run`` runs the same steps on the CPU at small sizes (smoke, one production case, the
perf matrix's first cases; no Dao build): what ``nox -s device -- --dry-run`` and
``tests/test_device_check.py`` exercise. Exit 0 when every step ran and the built-in kernels
(``torch``, ``tiled``) passed what they ran; 1 otherwise.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

BUILTIN = ("torch", "tiled")
SITE = "/tmp/convmatrix-site"  # where carried wheels go on the machine (PYTHONPATH)


@dataclass
class Step:
    name: str
    command: list[str]
    exit_code: int | None = None  # None: not run (out of time), -9: killed at its limit
    seconds: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)
    elements: int = 0  # B*C*L summed over the run's cases (throughput)
    note: str = ""
    tail: str = ""


class Check:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out: Path = args.out.resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.db = f"sqlite:///{self.out / 'check.db'}"
        self.deadline = time.monotonic() + args.budget_s
        self.device = "cpu" if args.dry_run else "cuda"
        self.steps: list[Step] = []
        self.env = dict(os.environ)
        paths = (SITE, str(Path(__file__).resolve().parent.parent), self.env.get("PYTHONPATH"))
        self.env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        self.env["PYTHONUNBUFFERED"] = "1"

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, name: str, command: list[str], limit_s: float) -> Step:
        step = Step(name, command)
        self.steps.append(step)
        limit = min(limit_s, self.left() - 15)
        if limit < 10:
            step.note = "not run: the check's time was spent"
            return step
        start = time.monotonic()
        try:
            done = subprocess.run(command, env=self.env, capture_output=True, text=True,
                                  timeout=limit, cwd=self.out)  # fmt: skip
            step.exit_code, step.tail = done.returncode, (done.stdout + done.stderr)[-3000:]
        except subprocess.TimeoutExpired as exc:
            step.exit_code, step.note = -9, f"stopped at its limit of {limit:.0f} s"
            step.tail = ((exc.stdout or b"") + (exc.stderr or b""))[-3000:].decode(errors="replace")
        step.seconds = round(time.monotonic() - start, 2)
        print(f"[{step.seconds:7.1f} s] {name}: exit {step.exit_code} {step.note}", flush=True)
        return step

    def convmatrix(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "convmatrix", *args]

    def matrix_run(self, matrix: str, kernel: str, limit_s: float, *extra: str) -> Step:
        label = f"device-check {matrix} {kernel}"
        step = self.run(label, self.convmatrix(
            "run", "--matrix", matrix, "--kernel", kernel, "--device", self.device, "-n", "1",
            "--db", self.db, "--label", label, "--report", str(self.out / "reports"),
            "--reference-cache", str(self.out / "refcache"), *extra,
        ), limit_s)  # fmt: skip
        self._read_back(step, label)
        return step

    def _read_back(self, step: Step, label: str) -> None:
        """Counts, phases and elements of the run ``label`` from the check's database."""
        try:
            from convmatrix.db.database import Database
            from convmatrix.db.queries import load_results, resolve_run

            with Database(self.db, existing=True) as db, db.reading() as session:
                info = resolve_run(session, label)
                results = load_results(session, info.id)
        except Exception as exc:  # not recorded (a usage error, no SQLAlchemy): say so
            step.note = (step.note + f"; not read back: {exc}").strip("; ")
            return
        step.counts = {k: v for k, v in info.counts.items() if v}
        for r in results:
            for phase, seconds in r.phases.items():
                step.phases[phase] = round(step.phases.get(phase, 0.0) + seconds, 3)
            c = r.case
            step.elements += c.batch * c.dim * (c.seqlen or c.tokens or 0)


def install_wheels(wheels: Path) -> str:
    """Install the carried wheels into ``SITE`` (no index, no dependencies resolved)."""
    files = sorted(glob.glob(str(wheels / "*.whl")))
    if not files:
        return f"no wheels in {wheels}"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
         "--upgrade", "--target", SITE, *files], capture_output=True, text=True,
    )  # fmt: skip
    return "installed" if done.returncode == 0 else f"pip failed: {done.stderr[-500:]}"


def start_dao_build(check: Check, wheels: Path | None) -> subprocess.Popen[str] | None:
    sdists = sorted(glob.glob(str(wheels / "causal_conv1d-*.tar.gz"))) if wheels else []
    if check.args.dry_run or not sdists:
        return None
    env = dict(check.env, CAUSAL_CONV1D_FORCE_BUILD="TRUE", MAX_JOBS=str(os.cpu_count() or 8),
               TORCH_CUDA_ARCH_LIST="9.0")  # fmt: skip
    log = open(check.out / "dao-build.log", "w")  # noqa: SIM115 - the build's own log
    return subprocess.Popen(
        [sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
         "--no-index", "--target", SITE, sdists[-1]],
        env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def dao_parity_sample(check: Check, n: int) -> list[str]:
    """Every k-th case id of dao-parity for ``dao`` (a spread over the grid)."""
    done = subprocess.run(check.convmatrix("expand", "dao-parity", "--kernel", "dao",
                                           "--format", "jsonl"),
                          env=check.env, capture_output=True, text=True)  # fmt: skip
    ids = [json.loads(line)["id"] for line in done.stdout.splitlines() if line.strip()]
    step = max(1, len(ids) // n)
    return ids[::step][:n]


def plan(check: Check) -> list[tuple[str, str, float, tuple[str, ...]]]:
    """(matrix, kernel, limit seconds, extra args) of the matrix runs."""
    if check.args.dry_run:
        first = _first_cases(check, "production", "torch", 1)
        perf = _first_cases(check, "perf", "tiled", 2)
        return [
            ("smoke", "torch", 240, ()), ("smoke", "tiled", 240, ()),
            ("production", "torch", 300, tuple(a for c in first for a in ("--case", c))),
            ("perf", "tiled", 240, tuple(a for c in perf for a in ("--case", c))),
        ]  # fmt: skip
    runs = [(m, k, 150.0, ()) for m in ("smoke", "nightly") for k in ("torch", "tiled", "fla")]
    runs += [("production", k, 200.0, ()) for k in ("torch", "tiled")]
    runs += [("perf", "tiled", 120.0, ())]
    return runs


def _first_cases(check: Check, matrix: str, kernel: str, n: int) -> list[str]:
    done = subprocess.run(check.convmatrix("expand", matrix, "--kernel", kernel, "--format",
                                           "jsonl"), env=check.env, capture_output=True,
                          text=True)  # fmt: skip
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    rows = [r for r in rows if r.get("op") != "update"]
    rows.sort(key=lambda r: r["batch"] * r["dim"] * (r.get("seqlen") or 1))
    return [r["id"] for r in rows[:n]]


def write_summary(check: Check, extra: dict[str, Any]) -> Path:
    runs = [asdict(s) for s in check.steps]
    summary = {"device": check.device, "dry_run": check.args.dry_run, **extra, "steps": runs}
    (check.out / "summary.json").write_text(json.dumps(summary, indent=1))
    from jinja2 import Environment

    page = Environment(autoescape=True).from_string(_HTML).render(s=summary)
    (check.out / "summary.html").write_text(page)
    return check.out / "summary.json"


_HTML = """<!doctype html><meta charset="utf-8"><title>convmatrix device check</title>
<h1>Device check on {{ s.device }}{% if s.dry_run %} (dry run){% endif %}</h1>
<pre>{{ s.devices }}</pre><p>Dao build: {{ s.dao_build }}; wheels: {{ s.wheels }}</p>
<table border="1" cellpadding="3"><tr><th>step</th><th>exit</th><th>seconds</th><th>counts</th>
<th>phases (s)</th><th>elements</th><th>note</th></tr>
{% for r in s.steps %}<tr><td>{{ r.name }}</td><td>{{ r.exit_code }}</td><td>{{ r.seconds }}</td>
<td>{{ r.counts }}</td><td>{{ r.phases }}</td><td>{{ r.elements }}</td><td>{{ r.note }}</td></tr>
{% endfor %}</table>"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="the same steps on this CPU")
    parser.add_argument("--out", type=Path, default=Path("device-check"))
    parser.add_argument("--wheels", type=Path, help="the folder device_wheels.py prepared")
    parser.add_argument("--budget-s", type=float, default=540.0, help="the whole check's time")
    args = parser.parse_args()
    check = Check(args)
    wheels = install_wheels(args.wheels) if args.wheels and not args.dry_run else "not needed"
    devices = check.run("devices", check.convmatrix("devices", "--format", "json"), 60)
    check.run("selfcheck", check.convmatrix("selfcheck", "--device", check.device), 120)
    build = start_dao_build(check, args.wheels)
    for matrix, kernel, limit, extra in plan(check):
        check.matrix_run(matrix, kernel, limit, *extra)
    dao = "not built (dry run)" if args.dry_run else "no sdist carried"
    if build is not None:
        try:
            build.wait(timeout=max(1.0, check.left() - 150))
            dao = "built" if build.returncode == 0 else f"failed (exit {build.returncode})"
        except subprocess.TimeoutExpired:
            build.kill()
            dao = "not built in time"
        if dao == "built":
            check.matrix_run("nightly", "dao", 90)
            sample = dao_parity_sample(check, 60)
            check.matrix_run("dao-parity", "dao", 90, *(a for c in sample for a in ("--case", c)))
    path = write_summary(check, {"devices": devices.tail, "dao_build": dao, "wheels": wheels})
    print(f"summary: {path}")
    return 1 if any(_failed(s) for s in check.steps) else 0


def _failed(step: Step) -> bool:
    """A step that did not run to its end, a harness step that failed, or a built-in kernel
    that failed a case (another kernel failing cases is a finding, not a failed check)."""
    if step.exit_code is None or step.exit_code not in (0, 1):
        return True
    matrix_run = step.name.startswith("device-check ")
    return step.exit_code == 1 and (not matrix_run or step.name.split()[-1] in BUILTIN)


if __name__ == "__main__":
    sys.exit(main())
