"""The reference cache, piece by piece on real files: a key that covers every input of the
reference (each perturbed alone is a miss), the stored form read back bit for bit and judged
exactly as when computed, its size against the estimate, eviction, admission, the counters,
and ``convmatrix cache``. Damage and whole runs: tests/test_refcache_damage.py."""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from test_layering import imported

from convmatrix.core.bounds import Magnitudes
from convmatrix.core.case import Case
from convmatrix.core.contract import Capabilities
from convmatrix.core.tolerances import Policy
from convmatrix.kernels.builtin.framework import TorchKernel
from convmatrix.runners.case.bounds import bound_of
from convmatrix.runners.case.execute import Context, build_inputs, run_case
from convmatrix.runners.case.inputs import place
from convmatrix.runners.case.phases import PHASES
from convmatrix.runners.case.refcache import key as keys
from convmatrix.runners.case.refcache.cache import ReferenceCache
from convmatrix.runners.case.refcache.compact import compact, expand, round_up
from convmatrix.runners.case.refcache.directory import CacheDir
from convmatrix.runners.case.refcache.footprint import admit, entry_bytes, overhead_bytes
from convmatrix.runners.case.refcache.key import BoundSpec, cache_key
from convmatrix.runners.case.reference import channel_blocks, judged_blocks

CASE = Case("t", "fwd_bwd", 4, 12, 2, seqlen=19, activation="silu", initial_state="random",
            final_state=True, dfinal="random", seq_lens=(7, 12))  # fmt: skip
SPEC = BoundSpec(Capabilities(), Policy())
CPU = torch.device("cpu")


def judged(case: Case, cache: ReferenceCache | None, spec: BoundSpec = SPEC) -> list:
    """Every block's (block, r, bound, slack magnitudes) of ``case``, as judging reads them."""
    inputs = build_inputs(case, CPU)
    blocks = channel_blocks(case, inputs)
    return [(b, *parts) for b, parts in judged_blocks(case, inputs, blocks, spec, cache=cache)]


def assert_same(a: list, b: list) -> None:
    """Two ``judged`` results bit for bit."""
    assert len(a) == len(b)
    for (b0, *parts0), (b1, *parts1) in zip(a, b, strict=True):
        assert b0 == b1
        for d0, d1 in zip(parts0, parts1, strict=True):
            assert d0.keys() == d1.keys()
            for name in d0:
                assert torch.equal(d0[name], d1[name]), name


def key_of(case: Case, inputs=None, spec: BoundSpec = SPEC, device: str = "cpu"):
    inputs = build_inputs(case, CPU) if inputs is None else inputs
    spans = [None if b is None else (b.start, b.stop) for b in channel_blocks(case, inputs)]
    return cache_key(case, inputs, spans, spec, device)


def test_a_cached_reference_is_judged_bit_for_bit_as_a_computed_one(tmp_path):
    cache = ReferenceCache(tmp_path / "refs")
    computed = judged(CASE, None)  # no cache: computed, in the stored form
    first = judged(CASE, cache)  # a miss: computed, then stored
    assert len(list(cache.directory.files())) == 1
    again = judged(CASE, cache)  # a hit, read from the file
    assert_same(computed, first)
    assert_same(computed, again)
    assert cache.directory.stats()["hit"] == 1 and cache.directory.stats()["miss"] == 1


def test_a_case_of_many_blocks_round_trips_too(tmp_path):
    big = replace(CASE, dim=40, seqlen=9000, seq_lens=None, x_dtype="bfloat16")
    cache = ReferenceCache(tmp_path / "refs")
    assert len(channel_blocks(big, build_inputs(big, CPU))) > 1
    computed = judged(big, None)
    judged(big, cache)
    assert_same(computed, judged(big, cache))


def test_the_bound_is_rounded_up_never_down_and_zero_stays_zero():
    b = torch.tensor([0.0, 1e-300, 2.0**-150, 1.0, 1 + 2.0**-30, 3.0e38, 1e39], dtype=torch.float64)
    up = round_up(b)
    assert up.dtype == torch.float64  # 1e39 does not fit float32: kept in float64
    small = round_up(b[:-1])
    assert small.dtype == torch.float32
    assert bool((small.double() >= b[:-1]).all())
    assert small[0] == 0  # an element expected to be exactly 0 keeps a zero bound
    # the smallest float32 above: at most one float32 step (2^-23 relative) looser
    assert bool((small.double() <= b[:-1] * (1 + 2.0**-23) + 2.0**-149).all())


def test_the_bfloat16_bound_is_the_smallest_above_and_overflow_keeps_float64():
    # bfloat16 keeps float32's exponent range: 3.0e38 fits, 3.4e38 (above its largest
    # finite, 3.39e38) would round to inf, so the block keeps float64; an infinite bound
    # (a reference that overflowed) stays infinite.
    b = torch.tensor([0.0, 2.0**-140, 1.0, 1 + 2.0**-9, 1 + 2.0**-7, 3.0e38], dtype=torch.float64)
    up = round_up(b, torch.bfloat16)
    assert up.dtype == torch.bfloat16
    assert bool((up.double() >= b).all()) and up[0] == 0
    # one bfloat16 step (2^-7 relative) at most: the next value down is below b
    step_down = (up.view(torch.int16) - 1).view(torch.bfloat16).double()
    assert bool((step_down[1:] < b[1:]).all())
    assert round_up(torch.cat([b, torch.tensor([3.4e38], dtype=torch.float64)]),
                    torch.bfloat16).dtype == torch.float64  # fmt: skip
    assert torch.isinf(round_up(torch.tensor([1.0, math.inf], dtype=torch.float64))).any()


def _perturbations() -> dict:
    """Each input of the reference changed alone, the case unchanged (name -> (case, inputs,
    spec, device) for ``key_of``)."""

    def changed(edit):
        inputs = build_inputs(CASE, CPU)
        edit(inputs)
        return CASE, inputs, SPEC, "cpu"

    def relaid(inputs):  # the same values, x handed over channel-last
        inputs.x = place("x", inputs.x.values, CPU, "channel_last")

    def add(t):
        t.view(-1)[0] += 1.0

    def spec(contract=Capabilities(), policy=Policy()):  # noqa: B008 - frozen values
        return BoundSpec(contract, policy)

    return {
        "x": changed(lambda i: add(i.x.values)),
        "weight": changed(lambda i: add(i.weight.values)),
        "bias": changed(lambda i: add(i.bias.values)),
        "initial state": changed(lambda i: add(i.initial_state.values)),
        "dy (upstream gradient of y)": changed(lambda i: add(i.g)),
        "dfinal (upstream gradient of the final state)": changed(lambda i: add(i.q)),
        "seq_idx (packing)": changed(lambda i: i.seq_idx.view(-1).__setitem__(-1, 0)),
        "x's dtype": changed(lambda i: setattr(i.x, "values", i.x.values.to(torch.float16))),
        "x's layout": changed(relaid),
        "dy's layout": changed(lambda i: setattr(i, "g_view", i.g.to(CPU).transpose(1, 2))),
        "activation": (replace(CASE, activation=None), None, SPEC, "cpu"),
        "seed (the case id)": (replace(CASE, suite="u"), None, SPEC, "cpu"),
        "declared accumulation": (CASE, None, spec(Capabilities(accumulate="float64")), "cpu"),
        "bound model": (CASE, None, spec(policy=Policy(bound_lambda=5.0)), "cpu"),
        "reference device": (CASE, None, SPEC, "cuda"),
    }


@pytest.mark.parametrize("what", list(_perturbations()))
def test_each_input_of_the_reference_perturbed_alone_is_a_miss(tmp_path, what):
    cache = ReferenceCache(tmp_path / "refs")
    judged(CASE, cache)  # the unperturbed entry
    case, inputs, spec, device = _perturbations()[what]
    key = key_of(case, inputs, spec, device)
    assert key.hex != key_of(CASE).hex
    spans = [None if b is None else (b.start, b.stop) for b in
             channel_blocks(case, build_inputs(case, CPU))]  # fmt: skip
    assert list(cache.read(key, spans)) == []  # nothing read: a miss
    assert cache.directory.stats()["miss"] == 2


def test_a_key_without_the_upstream_gradients_would_serve_a_stale_reference(tmp_path):
    """Issue 33's deliberate bug: dy left out of the key. Two draws of dy give different dx
    references, so they must be different entries; with dy out of the key the second is a
    hit on the first's dx."""
    cache = ReferenceCache(tmp_path / "refs")
    inputs = build_inputs(CASE, CPU)
    blocks = channel_blocks(CASE, inputs)
    first = list(judged_blocks(CASE, inputs, blocks, SPEC, cache=cache))
    other = build_inputs(CASE, CPU)
    other.g = other.g * 2  # another upstream gradient: twice the dx
    second = list(judged_blocks(CASE, other, blocks, SPEC, cache=cache))
    fresh = list(judged_blocks(CASE, other, blocks, SPEC))
    assert cache.directory.stats()["hit"] == 0, "dy is not in the key"
    for (_, (r1, _, _)), (_, (r2, _, _)) in zip(second, fresh, strict=True):
        assert torch.equal(r1["dx"], r2["dx"])
    assert not torch.equal(first[0][1][0]["dx"], second[0][1][0]["dx"])


def test_the_key_follows_the_version_and_the_blocks(monkeypatch):
    key = key_of(CASE)
    assert key_of(CASE) == key  # drawn again: the same
    inputs = build_inputs(CASE, CPU)
    assert cache_key(CASE, inputs, [(0, 6), (6, 12)], SPEC).hex != key.hex
    monkeypatch.setattr(keys, "REFERENCE_VERSION", keys.REFERENCE_VERSION + 1)
    assert key_of(CASE).hex != key.hex  # a new oracle invalidates every entry


@pytest.mark.parametrize(
    ("x_dtype", "per_element"), [("float32", 16), ("bfloat16", 14), ("float16", 14)]
)
def test_an_entry_weighs_what_the_estimate_says(tmp_path, x_dtype, per_element):
    """Bytes per element of x for fwd_bwd, y's and dx's together: 16 judged in float32 (r split
    into float32 and an int8 remainder, 5 bytes, a bfloat16 bound, and dx's bfloat16
    magnitudes), 14 in bf16/fp16 (r in float32); version 3 stored 26 and 18, version 1 48
    with SiLU."""
    case = replace(CASE, dim=64, seqlen=4096, seq_lens=None, x_dtype=x_dtype,
                   initial_state=None, final_state=False, dfinal=None)  # fmt: skip
    cache = ReferenceCache(tmp_path / "refs")
    judged(case, cache)
    (entry,) = cache.directory.files()
    elements = case.batch * case.dim * case.seqlen
    r_bytes = (per_element - 2) // 2 - 2  # y and dx: r and a bfloat16 bound; dx its mags
    assert r_bytes == (5 if x_dtype == "float32" else 4)
    body = elements * per_element + case.dim * (case.width + 1) * (5 + 2 + 2)  # dw, db: f32
    assert body <= entry.size <= entry_bytes(case) == body + overhead_bytes(case)
    assert entry.size / elements < per_element + 0.1


def test_the_stored_form_never_fails_an_output_the_exact_reference_passes():
    """r' (the stored r) is within |r - r'| of r and that is added to the bound before it is
    rounded up: |a - r'| <= |a - r| + |r - r'| <= bound', for an output a at the very edge of
    the exact bound, in every stored form."""
    torch.manual_seed(0)
    for x_dtype in ("float32", "bfloat16", "float64"):
        case = replace(CASE, x_dtype=x_dtype, w_dtype=x_dtype, seq_lens=None)
        r = torch.randn(2, 12, 19, dtype=torch.float64) * 1e3
        mag = r.abs() * 3 + torch.rand(2, 12, 19, dtype=torch.float64)
        stored, judged = compact(case, None, {"dx": r}, {"dx": Magnitudes(mag, 4)}, SPEC)
        refs, bounds, mags = expand(case, stored)  # as a warm entry reads back
        for now, read in zip(judged, (refs, bounds, mags), strict=True):  # as computed now
            assert all(torch.equal(now[k], read[k]) for k in read) and now.keys() == read.keys()
        r1, bound1 = refs["dx"], bounds["dx"]
        exact = bound_of(r, Magnitudes(mag, 4), SPEC.contract, case, "dx", SPEC.policy)
        for side in (1.0, -1.0):  # an output exactly one exact bound away, either side
            a = r + side * exact
            assert bool(((a - r1).abs() <= bound1).all()), x_dtype
        assert bool((bound1 >= exact).all())
        # and not much looser: bfloat16's step (2^-7) and |r - r'| at most
        assert bool((bound1 <= exact * (1 + 2.0**-7) + (r - r1).abs() * 2 + 1e-300).all())
        # r' is close: 2^-32 |r| split, 2^-24 |r| in float32, exact in float64
        close = {"float32": 2.0**-32, "bfloat16": 2.0**-24, "float64": 0.0}[x_dtype]
        assert bool(((r - r1).abs() <= close * r.abs()).all()), x_dtype
        # what the chunk check allows for its extra rounding is never below the magnitudes
        assert bool((mags["dx"] >= mag).all()), x_dtype


def test_admission_keeps_the_largest_cases_that_fit_whatever_their_order():
    cases = [replace(CASE, seqlen=n, seq_lens=None) for n in (100, 400, 200, 300)]
    sizes = {c.seqlen: entry_bytes(c) for c in cases}
    limit = sizes[400] + sizes[200] + sizes[100] // 2
    admission = admit(cases, limit)
    assert admission.admitted == {c.id for c in cases if c.seqlen in (400, 200)}
    assert admit(list(reversed(cases)), limit) == admission
    assert admission.over and str(len(admission.admitted)) in admission.note("DIR")
    assert admit(cases, sum(sizes.values())).admitted == {c.id for c in cases}
    updates = [Case("u", "update", 4, 8, 2, tokens=1, steps=2, state_len=3)]
    assert admit(updates, 0).cases == 0  # updates are never cached


def test_a_case_left_out_is_neither_read_nor_written(tmp_path):
    admission = admit([CASE], 0)
    cache = ReferenceCache(tmp_path / "refs", 1 << 30, admission)
    assert_same(judged(CASE, None), judged(CASE, cache))
    assert list(cache.directory.files()) == []
    assert cache.directory.stats()["skipped"] == 1


def test_the_least_recently_used_entries_go_first(tmp_path):
    cache = ReferenceCache(tmp_path / "refs")
    cases = {n: replace(CASE, seqlen=n, seq_lens=None) for n in (19, 23, 29)}
    for c in cases.values():
        judged(c, cache)
    paths = {n: cache.directory.path_of(key_of(c).hex) for n, c in cases.items()}
    for n, moment in ((19, 100), (23, 300), (29, 200)):  # 19 used longest ago, then 29
        os.utime(paths[n], (moment, moment))
    sizes = {n: p.stat().st_size for n, p in paths.items()}
    directory = CacheDir(cache.root, sizes[23] + sizes[29])
    assert directory.evict() == 1
    assert sorted(f.name for f in directory.files()) == sorted(paths[n].name for n in (23, 29))
    judged(cases[29], cache)  # a hit touches it: 23 is now the oldest
    assert CacheDir(cache.root, sizes[29]).evict() == 1
    assert [f.name for f in directory.files()] == [paths[29].name]
    assert directory.stats()["evicted"] == 2


def test_a_stale_temporary_file_is_swept_a_fresh_one_kept(tmp_path):
    cache = ReferenceCache(tmp_path / "refs")
    judged(CASE, cache)
    sub = next(p for p in cache.root.iterdir() if p.is_dir())  # not the counters file
    stale, fresh = sub / ".tmp-abc123.ref", sub / ".tmp-def456.ref"
    stale.write_bytes(b"x" * 10)
    fresh.write_bytes(b"y" * 10)
    os.utime(stale, (0, 0))
    CacheDir(cache.root).evict()
    assert not stale.exists() and fresh.exists()


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


def test_the_cache_command_shows_and_clears(tmp_path, capsys):
    from convmatrix.cli import main

    root = tmp_path / "refs"
    cache = ReferenceCache(root)
    judged(CASE, cache)
    judged(CASE, cache)
    assert main(["cache", "--reference-cache", str(root), "--reference-cache-size", "1G"]) == 0
    out = capsys.readouterr().out
    assert str(root) in out and "in 1 entries, limit 1.0 GiB" in out
    assert "1 hits, 1 misses, 0 failed their check" in out and "1 stored" in out
    assert main(["cache", "--reference-cache", str(root), "--matrix", "smoke"]) == 0
    assert "smoke  " in capsys.readouterr().out
    assert main(["cache", "clear", "--reference-cache", str(root)]) == 0
    assert "removed 1 files" in capsys.readouterr().out
    assert list(CacheDir(root).files()) == [] and CacheDir(root).stats()["hit"] == 0
    assert main(["cache", "--reference-cache", "off"]) == 0
    assert "off" in capsys.readouterr().out


def test_the_cache_command_never_imports_torch(tmp_path):
    root = str(tmp_path / "refs")
    for argv in (["cache", "--reference-cache", root], ["cache", "clear", "--reference-cache",
                                                         root]):  # fmt: skip
        assert imported(argv, ("torch",)) == ""


def test_the_reference_on_the_cpu_device_is_the_host_reference_bit_for_bit(capsys):
    from convmatrix.cli import main

    inputs = build_inputs(CASE, CPU)
    spans = channel_blocks(CASE, inputs)
    host = [(b, *p) for b, p in judged_blocks(CASE, inputs, spans, SPEC)]
    assert_same(host, [(b, *p) for b, p in judged_blocks(CASE, inputs, spans, SPEC, device=CPU)])
    assert main(["selfcheck", "--device", "cpu"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "reference on cpu" in x)
    assert "max|diff| = 0.000e+00  (limit 0e+00)" in line


def test_the_directory_is_only_created_by_a_write(tmp_path):
    root = tmp_path / "refs"
    assert list(CacheDir(root).files()) == [] and CacheDir(root).usage() == (0, 0)
    assert not Path(root).exists()


def test_a_run_larger_than_the_cache_says_so_and_keeps_its_largest_cases(tmp_path):
    """The tiny matrix's three forward entries against a limit that holds only the largest:
    the run says so before it starts and stores that one; the next run reads it and leaves
    the other two out, judging all alike."""
    import subprocess

    from runner_helpers import TINY, child_env, convmatrix_cmd, results

    from convmatrix.matrix import expand_matrix, load_matrix

    forward = [c for c in expand_matrix(load_matrix(str(TINY)), None).cases if c.op != "update"]
    largest = max(forward, key=lambda c: (entry_bytes(c), c.id))
    limit = entry_bytes(largest) + 100
    url, root = f"sqlite:///{tmp_path / 'r.db'}", tmp_path / "refs"
    outs = []
    for cache in ("off", str(root), str(root)):
        args = ["run", "--matrix", str(TINY), "--kernel", "torch", "-n", "0", "--db", url,
                "--reference-cache", cache, "--reference-cache-size", str(limit)]  # fmt: skip
        done = subprocess.run(convmatrix_cmd(*args), cwd=tmp_path, env=child_env(),
                              capture_output=True, text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        outs.append(done.stdout)
    note = "reference cache: the 3 cached cases' references need about"
    assert note not in outs[0] and note in outs[1] and "keeping the 1 largest" in outs[1]
    torch_spec = BoundSpec(TorchKernel().capabilities, Policy())
    assert [f.name[:40] for f in CacheDir(root).files()] == [key_of(largest, spec=torch_spec).hex]
    stats = CacheDir(root).stats()
    assert (stats["hit"], stats["miss"], stats["skipped"]) == (1, 1, 4)
    first, *others = ([(r.case.id, r.outcome, [(o.output, o.bound_usage, o.e_abs)
                                                for o in r.outputs]) for r in results(url, i)]
                      for i in (1, 2, 3))  # fmt: skip
    assert all(other == first for other in others)
