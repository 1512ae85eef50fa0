"""The reference cache: keyed by everything that decides a reference, read back bit for bit,
bounded by size with the least recently used entries evicted, never trusted when damaged;
verdicts and usages identical with and without it; a run reads it (a planted entry changes
the verdict); phases are recorded with every case."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace

import pytest
import torch
from runner_helpers import TINY, child_env, convmatrix_cmd, results

from convmatrix.core.case import Case
from convmatrix.kernels.builtin.framework import TorchKernel
from convmatrix.runners import refcache
from convmatrix.runners.execute import Context, build_inputs, run_case
from convmatrix.runners.invoke import channel_blocks, reference_blocks
from convmatrix.runners.phases import PHASES
from convmatrix.runners.refcache import ReferenceCache, cache_key

CASE = Case("t", "fwd_bwd", 4, 12, 2, seqlen=19, activation="silu", initial_state="random",
            final_state=True, dfinal="random")  # fmt: skip


def _blocks(case: Case, cache: ReferenceCache | None):
    inputs = build_inputs(case, torch.device("cpu"))
    spans = channel_blocks(case, inputs)
    return [(b, refs, mags) for b, (refs, mags) in reference_blocks(case, inputs, spans,
                                                                     cache=cache)]  # fmt: skip


def test_a_cached_reference_is_the_computed_one_bit_for_bit(tmp_path):
    cache = ReferenceCache(tmp_path / "refs")
    computed = _blocks(CASE, None)
    first = _blocks(CASE, cache)  # a miss: computed, then stored
    assert len(list(cache.entries())) == 1
    again = _blocks(CASE, cache)  # a hit
    for blocks in (first, again):
        for (b0, r0, m0), (b1, r1, m1) in zip(computed, blocks, strict=True):
            assert b0 == b1 and r0.keys() == r1.keys() and m0.keys() == m1.keys()
            for name in r0:
                assert torch.equal(r0[name], r1[name])
            for name, mag in m0.items():
                for field in ("mag", "elem", "zsens"):
                    a, b = getattr(mag, field), getattr(m1[name], field)
                    assert (a is None and b is None) or torch.equal(a, b)
                assert (mag.n, mag.n_z) == (m1[name].n, m1[name].n_z)


def test_the_key_follows_what_decides_the_reference(monkeypatch):
    inputs = build_inputs(CASE, torch.device("cpu"))
    spans = [None]
    key = cache_key(CASE, inputs, spans)
    assert cache_key(CASE, build_inputs(CASE, torch.device("cpu")), spans) == key  # drawn again
    other = replace(CASE, seqlen=20)
    assert cache_key(other, build_inputs(other, torch.device("cpu")), spans) != key
    changed = build_inputs(CASE, torch.device("cpu"))
    changed.x.values[0, 0, 0] += 1.0  # inputs drawn or rounded otherwise: a miss
    assert cache_key(CASE, changed, spans) != key
    assert cache_key(CASE, inputs, [(0, 6), (6, 12)]) != key  # blocked otherwise
    monkeypatch.setattr(refcache, "REFERENCE_VERSION", refcache.REFERENCE_VERSION + 1)
    assert cache_key(CASE, inputs, spans) != key  # a new oracle invalidates every entry


def test_the_least_recently_used_entries_go_first_and_damage_is_a_miss(tmp_path):
    cache = ReferenceCache(tmp_path / "refs")
    cases = [replace(CASE, seqlen=n) for n in (19, 23, 29)]
    for c in cases:
        _blocks(c, cache)
    paths = {c.seqlen: next(e.path for e in cache.entries()
                            if e.name.startswith(_key(c))) for c in cases}  # fmt: skip
    size = os.path.getsize(paths[19])
    for n, moment in ((19, 100), (23, 300), (29, 200)):  # 19 used longest ago, then 29
        os.utime(paths[n], (moment, moment))
    cache.limit_bytes = os.path.getsize(paths[23]) + os.path.getsize(paths[29])  # those two
    cache.evict()
    assert sorted(os.path.basename(e.path) for e in cache.entries()) == sorted(
        os.path.basename(paths[n]) for n in (23, 29)
    )
    with open(paths[23], "r+b") as damaged:  # a truncated write (a full disk)
        damaged.truncate(size // 3)
    assert cache.get(_key(cases[1])) is None and not os.path.exists(paths[23])


def _key(case: Case) -> str:
    inputs = build_inputs(case, torch.device("cpu"))
    spans = [None if b is None else (b.start, b.stop) for b in channel_blocks(case, inputs)]
    return cache_key(case, inputs, spans)


def test_every_case_records_its_phases():
    result = run_case(replace(CASE, checks=("causality",)), Context(TorchKernel()))
    assert result.outcome == "passed"
    assert set(result.phases) <= set(PHASES)
    assert {"inputs", "kernel", "reference", "metrics", "properties", "harness"} <= set(
        result.phases
    )
    assert all(s >= 0 for s in result.phases.values())
    # The phases divide the case's time: they add up to it (harness takes the rest).
    assert sum(result.phases.values()) == pytest.approx(result.duration_s, abs=1e-5)


def _run(tmp_path, url, cache: str) -> subprocess.CompletedProcess[str]:
    args = ["run", "--matrix", str(TINY), "--kernel", "torch", "-n", "0", "--db", url,
            "--reference-cache", cache]  # fmt: skip
    return subprocess.run(convmatrix_cmd(*args), cwd=tmp_path, env=child_env(),
                          capture_output=True, text=True, timeout=600)  # fmt: skip


def _verdicts(url: str, run_id: int) -> dict:
    return {
        r.case.id: (r.outcome, [(o.output, o.bound_usage, o.e_abs, o.passed) for o in r.outputs])
        for r in results(url, run_id)
    }


def test_a_run_reads_the_cache_and_judges_exactly_as_without_it(tmp_path):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    cache_dir = tmp_path / "refs"
    assert _run(tmp_path, url, "off").returncode == 0
    assert not cache_dir.exists()
    assert _run(tmp_path, url, str(cache_dir)).returncode == 0  # fills it
    assert _run(tmp_path, url, str(cache_dir)).returncode == 0  # reads it
    assert _verdicts(url, 1) == _verdicts(url, 2) == _verdicts(url, 3)
    entries = list(ReferenceCache(cache_dir).entries())
    assert entries  # every forward case's reference
    # A planted entry: the run believes the cache (the reference's y moved by 1.0 fails the
    # case), so the cache is what the second run used; off, the run computes and passes.
    planted = torch.load(entries[0].path, weights_only=True)
    for _, refs, _ in planted["blocks"]:
        refs["y"] += 1.0
    torch.save(planted, entries[0].path)
    done = _run(tmp_path, url, str(cache_dir))
    assert done.returncode == 1 and "1 failed" in done.stdout, done.stdout
    assert _run(tmp_path, url, "off").returncode == 0
    phases = json.loads(json.dumps(results(url, 3)[0].phases))
    assert "reference" in phases and "kernel" in phases


def test_the_reference_on_the_cpu_device_is_the_host_reference_bit_for_bit(capsys):
    from convmatrix.cli import main

    inputs = build_inputs(CASE, torch.device("cpu"))
    spans = channel_blocks(CASE, inputs)
    host = list(reference_blocks(CASE, inputs, spans))
    there = list(reference_blocks(CASE, inputs, spans, device=torch.device("cpu")))
    for (_, (r0, _)), (_, (r1, _)) in zip(host, there, strict=True):
        assert all(torch.equal(r0[k], r1[k]) for k in r0)
    assert main(["selfcheck", "--device", "cpu"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "reference on cpu" in x)
    assert "max|diff| = 0.000e+00  (limit 0e+00)" in line
