"""A run's options, declared once: each field of ``RunOptions`` carries its flag, help and type,
from which both ``convmatrix run``'s argparse options (``add_cli_options``) and the pytest
plugin's options (``add_pytest_options``) are generated, and ``checked`` validates them once for
every door (the CLI, ``convmatrix.run`` in Python, ``pytest --matrix``).

Fields without a flag are set by code only (``files``: matrix files given to pytest as paths;
``scan``: whether the pipeline scans the run for regressions). The options that act after the
run (``--report``, ``--junit``, ...) are declared here too, so the run command has one list,
but only the pipeline (``convmatrix.pipeline``) reads them.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from convmatrix.core.environment import check_environment
from convmatrix.core.errors import UsageError
from convmatrix.core.recorded import Recorded
from convmatrix.core.records import RUN_KINDS
from convmatrix.core.sanitise import redact_argv
from convmatrix.core.verdict import RULES
from convmatrix.runners.run.account import DEFAULT_MIN_JUDGED
from convmatrix.runners.run.shards import parse_shard
from convmatrix.runners.run.store import Shard
from convmatrix.runners.run.threads import decide, export

__all__ = [
    "DEVICES",
    "EXECUTOR_NAMES",
    "FAIL_ON",
    "REFERENCE_DEVICES",
    "RERUN",
    "RunOptions",
    "add_cli_options",
    "add_pytest_options",
    "check_device",
    "check_share",
    "parse_fail_on",
    "summary_path",
    "worker_count",
]

DEVICES = ("auto", "cpu", "cuda", "mlu")
REFERENCE_DEVICES = ("auto", "host", "device")
EXECUTOR_NAMES = ("xdist", "ray")  # runners.executors.EXECUTORS, without importing them
FAIL_ON = ("new-regressions",)
_PYTEST_PREFIX = "convmatrix_"  # pytest dests live in one namespace with other plugins'
# What a rerun of a recorded run's cases keeps (confirm, shrink, bisect, the report's command):
# how the cases ran and were judged; not where results went, nor what followed the run.
RERUN = ("matrix", "kernel", "device", "case_timeout", "reference_device", "reference_cache",
         "reference_cache_size", "max_cases", "rule", "threads")  # fmt: skip


@dataclass(frozen=True)
class Flag:
    """How one option is spelled on a command line (argparse and pytest take the same)."""

    flags: tuple[str, ...]
    help: str
    metavar: str | None = None
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    action: str | None = None  # store_true, count, extend, append
    pytest: bool = True  # also a ``pytest --matrix`` option (False: ``convmatrix run`` only)

    def argv(self, value: Any) -> list[str]:
        """The arguments that give this option ``value`` (``RunOptions.to_argv``)."""
        flag = self.flags[0]
        if self.action == "store_true":
            return [flag] if value else []
        if self.action == "count":
            return [flag] * int(value)
        values = value if self.action in ("extend", "append") else [value]
        out: list[str] = []
        for v in values:  # a value that looks like a flag is glued to a long one
            text = str(v)
            out += [f"{flag}={text}"] if text.startswith("-") and flag[:2] == "--" else [flag, text]
        return out

    def keywords(self, dest: str, default: Any) -> dict[str, Any]:
        kw: dict[str, Any] = {"dest": dest, "help": self.help, "default": default}
        for key in ("metavar", "type", "choices", "action"):
            if getattr(self, key) is not None:
                kw[key] = getattr(self, key)
        if self.action == "extend":
            kw["nargs"] = "+"
        return kw


def _option(*flags: str, default: Any = None, **spelling: Any) -> Any:
    factory = list if isinstance(default, list) else None
    meta = {"flag": Flag(tuple(flags), **spelling)}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class RunOptions:
    """What a run was asked to do, whatever door it came through and whatever executor runs it.
    ``checked()`` turns the options as given into the options a run is made of."""

    matrix: str | None = _option(
        "--matrix", help="built-in matrix name (smoke, nightly), a matrix file or cases .jsonl"
    )
    kernel: str | None = _option(
        "--kernel", help="registered kernel name or package.module:attribute"
    )
    device: str = _option(
        "--device", default="auto", help="auto (default), cpu, cuda or mlu (workers spread)"
    )
    workers: int | str = _option(
        "-n", default="auto", type=lambda text: int(text) if text.isdigit() else text,
        help="worker processes: N or auto", pytest=False,
    )  # fmt: skip  # under pytest, xdist's own -n
    db: str | None = _option(
        "--db", metavar="URL",
        help="database URL (default: $CONVMATRIX_DB, else sqlite:///convmatrix.db)",
    )  # fmt: skip
    no_db: bool = _option(
        "--no-db", default=False, action="store_true", help="do not record (summary only)"
    )
    label: str | None = _option("--label", help="free-text label stored with the run")
    commit: str | None = _option(
        "--commit", help="kernel commit (default: git HEAD of the kernel's source)"
    )
    cases: list[str] = _option(
        "--case", default=[], action="extend", metavar="ID",
        help="run only these cases (id, id prefix or pytest id)",
    )  # fmt: skip
    resume: str | None = _option(
        "--resume", metavar="RUN", help="run only the cases RUN (id, latest, label, commit) lacks"
    )
    case_timeout: float | None = _option(
        "--case-timeout", type=float, metavar="S", help="seconds per case (default: matrix's)"
    )
    reference_device: str = _option(
        "--reference-device", default="auto", choices=REFERENCE_DEVICES, pytest=True,
        help="where the float64 reference runs: auto (the case's device when it has float64, "
        "CUDA does; else the host), host, or device",
    )  # fmt: skip
    reference_cache: str | None = _option(
        "--reference-cache", metavar="DIR|off",
        help="on by default: reuse float64 references (and bounds) computed before, each "
        "checked when read, from this directory (default: $CONVMATRIX_REFERENCE_CACHE, else "
        "$XDG_CACHE_HOME or ~/.cache, /convmatrix/reference); off: never read or write it. "
        "`convmatrix cache` shows and clears it",
    )  # fmt: skip
    reference_cache_size: str = _option(
        "--reference-cache-size", default="8G", metavar="SIZE",
        help="the reference cache's limit, default 8G (e.g. 500M): a run whose references "
        "exceed it says so and keeps only its largest cases that fit; least recently used "
        "entries evicted beyond it",
    )  # fmt: skip
    max_cases: int | None = _option(
        "--max-cases", type=int, metavar="N",
        help="refuse a matrix that can expand to more than N cases, counted before expanding "
        "(default: the matrix's max_cases, else 100000)",
    )  # fmt: skip
    rule: str | None = _option(
        "--policy", choices=tuple(RULES), metavar="RULE",
        help=f"the rule of the verdict policy, overriding the matrix's: {', '.join(RULES)} "
        "(default: bound; docs/spec.md §4)",
    )  # fmt: skip
    threads: str | None = _option(
        "--threads", metavar="N|auto|torch",
        help="intra-op threads of each process that runs cases on the CPU: auto (default: one "
        "a worker, idle threads sleep, so a busy neighbour cannot make a run spin), torch "
        "(torch's default), or N (default: $CONVMATRIX_THREADS; $OMP_NUM_THREADS beats both)",
    )  # fmt: skip
    executor: str = _option(
        "--executor", "--engine", default="xdist", choices=EXECUTOR_NAMES, pytest=False,
        help="xdist: this host's devices (default); ray: a Ray cluster's (convmatrix[ray]); "
        "--engine is its older name",
    )  # fmt: skip
    address: str | None = _option(
        "--address", metavar="ADDR", pytest=False, help="the Ray cluster (default: a local one)"
    )
    shard: str | None = _option(
        "--shard", metavar="I/N", pytest=False,
        help="run shard I of N of one run (auto[/N]: I from the CI's index variable)",
    )  # fmt: skip
    run_label: str | None = _option(
        "--run-label", metavar="LABEL", pytest=False, help="the run every --shard writes into"
    )
    kind: str = _option(
        "--kind", default="run", choices=RUN_KINDS, pytest=False,
        help="what the run is for: run (default), or a run made to judge another (confirm, "
        "bisect, adequacy), never a baseline, 'latest' or a history point",
    )  # fmt: skip
    verbose: int = _option(
        "-v", "--verbose", default=0, action="count", pytest=False, help="one line per case"
    )
    # -- after the run (the pipeline's steps) --------------------------------------------------
    report: Path | None = _option(
        "--report", type=Path, metavar="DIR", pytest=False, help="write the HTML report here"
    )
    junit: Path | None = _option(
        "--junit", type=Path, metavar="FILE", pytest=False, help="write JUnit XML here"
    )
    summary: Path | None = _option(
        "--summary", type=Path, metavar="FILE", pytest=False,
        help="append the CI job summary (markdown) here (default: $GITHUB_STEP_SUMMARY when set)",
    )  # fmt: skip
    base_url: str | None = _option(
        "--base-url", metavar="URL", pytest=False,
        help="link the job summary to `convmatrix serve` here (default: $CONVMATRIX_BASE_URL)",
    )  # fmt: skip
    fail_on: list[str] = _option(
        "--fail-on", default=[], action="append", metavar="CONDITION", pytest=False,
        help="new-regressions: exit 1 only when this run found a new regression",
    )  # fmt: skip
    min_judged: float = _option(
        "--min-judged", type=float, default=DEFAULT_MIN_JUDGED, metavar="FRACTION",
        help="exit 4 (nothing judged) when fewer than this share of the planned cases got a "
        "verdict (passed, failed, crashed; skips, timeouts, errors do not count) or none did",
    )  # fmt: skip
    confirm: bool = _option(
        "--confirm", default=False, action="store_true", pytest=False,
        help="rerun the cases of new regressions: confirmed or flaky (flaky ones do not fail)",
    )  # fmt: skip
    shrink: int | None = _option(
        "--shrink", type=int, metavar="RUNS", pytest=False,
        help="shrink the run's new failures to their simplest failing cases, within RUNS case "
        "runs in all (60 at most per failure; convmatrix shrink, docs/search.md)",
    )  # fmt: skip
    # -- set by code, not flags ------------------------------------------------------------------
    files: tuple[str, ...] = ()  # *.matrix.yaml given to pytest as paths
    scan: bool = True  # the pipeline scans a recorded run for regressions
    sharding: Shard | None = None  # ``--shard`` and ``--run-label`` resolved by ``checked``

    @classmethod
    def from_namespace(cls, namespace: argparse.Namespace, **code: Any) -> RunOptions:
        """The options argparse parsed (``add_cli_options``), plus fields set by code."""
        return cls(**{f.name: getattr(namespace, f.name) for f in _flagged()}, **code)

    @classmethod
    def from_pytest(cls, config: Any, **code: Any) -> RunOptions:
        """The options a pytest command line gave (``add_pytest_options``)."""
        given = {
            f.name: config.getoption(_PYTEST_PREFIX + f.name)
            for f in _flagged()
            if f.metadata["flag"].pytest
        }
        return cls(**given, **code)

    def recorded(self) -> dict[str, Any]:
        """These options as a run stores them (``core.recorded``): every field by name, as JSON
        values (paths as strings, the shard as a mapping); a database URL without its
        password. ``from_recorded`` reads it back."""
        out = {f.name: _to_json(getattr(self, f.name)) for f in fields(self)}
        if self.db is not None:
            out["db"] = redact_argv([self.db])[0]
        return out

    @classmethod
    def from_recorded(cls, stored: Mapping[str, Any] | Recorded, **override: Any) -> RunOptions:
        """The options a run recorded (``recorded``, or a whole stored row of this release or
        an older one: ``core.recorded.RENAMED``), with ``override`` on top. Keys of no field
        (a later release's) are left out."""
        given = stored if isinstance(stored, Recorded) else Recorded.of(stored)
        hints = _hints()
        values = {k: _from_json(hints[k], v) for k, v in given.given.items() if k in hints}
        return cls(**{**values, **override})

    @classmethod
    def rerun(
        cls, stored: Mapping[str, Any], matrix: str, kernel: str, **override: Any
    ) -> RunOptions:
        """The options that rerun cases of a recorded run: the ``RERUN`` fields it recorded
        (its ``--policy`` rule, reference device, ...), the matrix it loaded and the kernel it
        ran (else ``matrix`` and ``kernel``, the run's names), ``override`` on top; the other
        fields their defaults."""
        row = Recorded.of(stored)
        kept = cls.from_recorded(row)
        return cls(**{
            **{name: getattr(kept, name) for name in RERUN},
            "matrix": row.matrix(matrix), "kernel": row.kernel(kernel), **override,
        })  # fmt: skip

    def to_argv(self) -> list[str]:
        """``convmatrix run``'s arguments for these options (without ``convmatrix run``): a
        flag for each value that is not its default, so that parsing them gives these options
        back (fields without a flag are code's: ``files``, ``scan``, ``sharding``)."""
        argv: list[str] = []
        for f in _flagged():
            value = getattr(self, f.name)
            if value != _default(f):
                argv += f.metadata["flag"].argv(value)
        return argv

    def export_threads(self) -> None:
        """The thread policy's wait into this process's environment (``runners.run.threads``):
        called before torch loads, it reaches this process's OpenMP (``-n 0``) and every
        worker and case child started after."""
        export(decide(self.threads))

    def checked(self) -> RunOptions:
        """These options validated and resolved (workers a number, the shard parsed, CI
        defaults read from the environment); ``UsageError`` names the argument at fault.
        Idempotent: checking checked options changes nothing."""
        check_environment()  # every declared variable, before any work (one line naming it)
        _check_choices(self)
        if self.shrink is not None and self.shrink < 2:
            raise UsageError(f"--shrink {self.shrink}: give a budget of at least 2 case runs")
        check_share(self.min_judged)
        if self.max_cases is not None and self.max_cases < 1:
            raise UsageError(f"--max-cases {self.max_cases}: give a number of cases >= 1")
        if self.resume and self.no_db:
            raise UsageError("--resume needs the database; drop --no-db")
        if not self.resume and (not self.matrix or not self.kernel) and not self.files:
            raise UsageError("--matrix and --kernel are required (or --resume RUN)")
        if self.case_timeout is not None and not (
            math.isfinite(self.case_timeout) and self.case_timeout > 0
        ):
            raise UsageError(
                f"--case-timeout must be a finite number of seconds > 0, not {self.case_timeout}"
            )
        if self.label is not None and (len(self.label) > 200 or "\x00" in self.label):
            raise UsageError("--label: at most 200 characters, without NUL")
        if self.address and self.executor != "ray":
            raise UsageError("--address is the Ray cluster's: give it with --executor ray")
        sharding = self.sharding or parse_shard(self.shard, self.run_label)
        if sharding is not None and self.no_db:
            raise UsageError("--shard writes into a shared database; drop --no-db")
        fail_on = parse_fail_on(self.fail_on)
        summary = summary_path(self.summary)
        if self.no_db:
            needs = [n for n, v in (("--report", self.report), ("--junit", self.junit),
                     ("--summary", summary), ("--confirm", self.confirm),
                     ("--shrink", self.shrink),
                     ("--fail-on", fail_on)) if v]  # fmt: skip
            if needs:
                raise UsageError(f"{', '.join(needs)} read the database; drop --no-db")
        decide(self.threads)  # a bad --threads is refused here, not in a worker
        parse_size(self.reference_cache_size)  # a typo is a usage error here, not in a worker
        return replace(
            self,
            workers=worker_count(self.workers, self.device),
            sharding=sharding,
            fail_on=fail_on,
            summary=summary,
            base_url=self.base_url or os.environ.get("CONVMATRIX_BASE_URL") or None,
        )


def check_share(min_judged: float) -> None:
    """``--min-judged``: a share of the planned cases, 0 to 1."""
    if not (math.isfinite(min_judged) and 0 <= min_judged <= 1):
        raise UsageError(f"--min-judged {min_judged}: give a share from 0 to 1 (e.g. 0.9)")


def parse_fail_on(values: list[str]) -> list[str]:
    """``--fail-on`` values (repeated or comma-separated), each one of FAIL_ON."""
    fail_on = [c.strip() for v in values for c in v.split(",") if c.strip()]
    unknown = [c for c in fail_on if c not in FAIL_ON]
    if unknown:
        raise UsageError(f"--fail-on {unknown[0]!r}: choose from {', '.join(FAIL_ON)}")
    return fail_on


def summary_path(given: Path | None) -> Path | None:
    """``--summary``, else the CI's job summary file (``$GITHUB_STEP_SUMMARY``) when set."""
    if given is None and os.environ.get("GITHUB_STEP_SUMMARY"):
        return Path(os.environ["GITHUB_STEP_SUMMARY"])
    return given


def check_device(device: str) -> None:
    """``--device``: one of DEVICES, with an index where a kind takes one (``cuda:1``)."""
    if device not in DEVICES and device.split(":")[0] not in DEVICES:
        raise UsageError(f"--device {device!r}: one of {', '.join(DEVICES)}")


def _check_choices(options: RunOptions) -> None:
    check_device(options.device)
    if options.rule is not None and options.rule not in RULES:
        raise UsageError(f"--policy {options.rule!r}: one of {', '.join(RULES)}")
    if options.kind not in RUN_KINDS:
        raise UsageError(f"--kind {options.kind!r}: one of {', '.join(RUN_KINDS)}")
    if options.executor not in EXECUTOR_NAMES:
        raise UsageError(f"--executor {options.executor!r}: one of {', '.join(EXECUTOR_NAMES)}")


def parse_size(text: str, what: str = "--reference-cache-size") -> int:
    """``500M``, ``8G``, ``1024`` (bytes) → bytes."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    body = str(text).strip().upper().removesuffix("B").removesuffix("I")
    number, unit = (body[:-1], body[-1]) if body[-1:] in units and body[-1:] else (body, "")
    try:
        size = float(number) * units[unit]
    except (ValueError, KeyError):
        raise UsageError(f"{what} {text!r}: give bytes or K, M, G, T (e.g. 8G)") from None
    if not math.isfinite(size) or size < 0:
        raise UsageError(f"{what} {text!r}: a size of 0 or more")
    return int(size)


def worker_count(spec: str | int, device: str) -> int:
    """``-n``: a number of workers, or ``auto``: one per device (per core on CPU)."""
    if spec != "auto":
        try:
            n = int(spec)
        except (TypeError, ValueError):
            raise UsageError(f"-n {spec!r}: give a number of workers or 'auto'") from None
        if n < 0:
            raise UsageError(f"-n {n}: the number of workers cannot be negative")
        return n
    from convmatrix.core.devices import cpu_cores, discover, resolve_device

    kind = resolve_device(device).type
    return cpu_cores() if kind == "cpu" else max(1, discover(kind).count)


def _flagged() -> list[Any]:
    return [f for f in fields(RunOptions) if "flag" in f.metadata]


def _hints() -> dict[str, Any]:
    return typing.get_type_hints(RunOptions)


def _to_json(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    return value


def _from_json(hint: Any, value: Any) -> Any:
    """A recorded JSON value as the field of type ``hint`` holds it."""
    if value is None:
        return None
    kinds = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    for kind in kinds:
        if kind is Path:
            return Path(value)
        if dataclasses.is_dataclass(kind) and isinstance(value, Mapping):
            return kind(**value)
        if typing.get_origin(kind) in (tuple, list):
            return typing.get_origin(kind)(value)
    return value


def _default(f: Any) -> Any:
    return f.default_factory() if f.default is MISSING else f.default


def add_cli_options(parser: argparse.ArgumentParser, only: tuple[str, ...] = ()) -> None:
    """Every option of ``RunOptions`` on ``convmatrix run``'s parser (dest: the field name),
    or only the fields named: a command that runs cases too (``explore``) spells them alike."""
    for f in _flagged():
        if only and f.name not in only:
            continue
        flag: Flag = f.metadata["flag"]
        parser.add_argument(*flag.flags, **flag.keywords(f.name, _default(f)))


def add_pytest_options(group: Any) -> None:
    """The options ``pytest --matrix`` takes, on the plugin's option group (dest prefixed)."""
    for f in _flagged():
        flag: Flag = f.metadata["flag"]
        if flag.pytest:
            kw = flag.keywords(_PYTEST_PREFIX + f.name, _default(f))
            if kw.get("action") == "extend":  # pytest's parser knows append, not extend
                kw["action"], kw.pop("nargs")
                kw["action"] = "append"
            group.addoption(*flag.flags, **kw)
