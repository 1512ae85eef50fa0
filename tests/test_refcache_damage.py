"""The reference cache cannot change a verdict: on real files, one flipped byte anywhere in an
entry, two entries swapped, a disk that fills (a real tmpfs, or a real file-size limit), and
links planted inside the cache change no verdict and remove nothing outside it; a run says
once what it found. Whole runs: cold, warm and off judge alike, a seeded bug included."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from runner_helpers import TINY, child_env, convmatrix_cmd, results
from test_refcache import CASE, assert_same, judged, key_of

from convmatrix.runners.case import reference
from convmatrix.runners.case.refcache.cache import ReferenceCache
from convmatrix.runners.case.refcache.directory import CacheDir
from convmatrix.runners.case.refcache.entry import Entry, write_entry
from convmatrix.runners.case.refcache.key import Key

TWO_BLOCKS = replace(CASE, dim=4, seqlen=6, seq_lens=None)  # 2 blocks of 2 channels: below
LIMIT_S = 600


@pytest.fixture(autouse=True)
def _small_blocks(monkeypatch):
    """Blocks of 2 channels for TWO_BLOCKS: an entry of two blocks in a few KB."""
    monkeypatch.setattr(reference, "BLOCK_ELEMENTS", 2 * (6 + 3) * 2)


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def _payload_start(raw: bytes) -> int:
    length = int.from_bytes(raw[8:16], "little")
    end = 24 + length
    return end + (-end % 64)


def test_one_flipped_byte_anywhere_in_an_entry_is_never_believed(tmp_path):
    """Every byte of a two-block entry flipped in turn: each read either fails its check
    (counted, removed) or, for the bytes nothing reads (the header's reserved word and its
    alignment zeros), hands out exactly the original values."""
    cache = ReferenceCache(tmp_path / "refs")
    judged(TWO_BLOCKS, cache)
    key = key_of(TWO_BLOCKS)
    path = cache.directory.path_of(key.hex)
    raw = path.read_bytes()
    spans = [(0, 2), (2, 4)]
    original = [(b.refs, b.bounds) for b in cache.read(key, spans)]
    unread = set(range(20, 24)) | set(range(24 + int.from_bytes(raw[8:16], "little"),
                                            _payload_start(raw)))  # fmt: skip
    believed = []
    for at in range(len(raw)):
        path.write_bytes(raw[:at] + bytes([raw[at] ^ 0xFF]) + raw[at + 1 :])
        read = [(b.refs, b.bounds) for b in cache.read(key, spans)]
        if len(read) == 2:
            believed.append(at)
            for (r0, b0), (r1, b1) in zip(original, read, strict=True):
                assert all(torch.equal(r0[k], r1[k]) for k in r0)
                assert all(torch.equal(b0[k], b1[k]) for k in b0)
    assert set(believed) <= unread, f"damage believed at {sorted(set(believed) - unread)[:5]}"
    stats = cache.directory.stats()
    assert stats["damaged"] == len(raw) - len(believed) > 0


@pytest.mark.parametrize("where", ["header", "first block", "last block"])
def test_a_damaged_entry_is_recomputed_exactly_and_stored_again(tmp_path, where):
    cache = ReferenceCache(tmp_path / "refs")
    computed = judged(TWO_BLOCKS, None)
    judged(TWO_BLOCKS, cache)
    path = cache.directory.path_of(key_of(TWO_BLOCKS).hex)
    raw = path.read_bytes()
    at = {"header": 100, "first block": _payload_start(raw) + 8, "last block": len(raw) - 9}
    _flip(path, at[where])
    assert_same(computed, judged(TWO_BLOCKS, cache))  # damaged: the rest computed
    assert_same(computed, judged(TWO_BLOCKS, cache))  # stored again: a hit
    stats = cache.directory.stats()
    assert (stats["damaged"], stats["hit"], stats["stored"]) == (1, 1, 2)


def test_two_entries_swapped_are_both_misses(tmp_path):
    cache = ReferenceCache(tmp_path / "refs")
    a, b = CASE, replace(CASE, activation=None)  # the same shapes, other values
    computed = [judged(c, None) for c in (a, b)]
    for c in (a, b):
        judged(c, cache)
    pa, pb = (cache.directory.path_of(key_of(c).hex) for c in (a, b))
    swap = pa.with_name("swap")
    os.replace(pa, swap)
    os.replace(pb, pa)
    os.replace(swap, pb)
    assert_same(computed[0], judged(a, cache))
    assert_same(computed[1], judged(b, cache))
    assert cache.directory.stats()["damaged"] == 2


def _outside(tmp_path: Path) -> tuple[Path, list[Path]]:
    """A directory outside the cache holding files named like entries and temporary files."""
    outside = tmp_path / "outside"
    outside.mkdir()
    files = [outside / ("ab" + "0" * 38 + ".ref"), outside / ".tmp-zzz.ref", outside / "data"]
    for f in files:
        f.write_bytes(b"keep me" * 100)
    return outside, files


def test_links_inside_the_cache_are_never_followed(tmp_path):
    cache = ReferenceCache(tmp_path / "refs")
    judged(CASE, cache)
    outside, files = _outside(tmp_path)
    os.symlink(outside, cache.root / "ab")  # a linked subdirectory
    key = key_of(CASE)
    entry = cache.directory.path_of(key.hex)
    real = entry.with_name("kept")
    os.replace(entry, real)
    os.symlink(real, entry)  # an entry that is a link (to a good entry)
    link = cache.root / entry.parent.name / ("cd" + "1" * 38 + ".ref")
    os.symlink(files[0], link)
    assert [f.name for f in cache.directory.files()] == []  # links are not the cache's
    computed = judged(CASE, None)
    assert_same(computed, judged(CASE, cache))  # the linked entry refused: recomputed
    assert cache.directory.stats()["damaged"] == 1
    assert CacheDir(cache.root, 0).evict() == 1  # the entry written again, nothing else
    CacheDir(cache.root).clear()
    assert all(f.read_bytes() == b"keep me" * 100 for f in files)
    assert real.exists() and link.is_symlink() and (cache.root / "ab").is_symlink()


def _run(cwd: Path, url: str, cache: str, *extra: str, kernel: str = "torch",
         matrix: str = str(TINY)) -> subprocess.CompletedProcess[str]:  # fmt: skip
    args = ["run", "--matrix", matrix, "--kernel", kernel, "-n", "0", "--db", url,
            "--reference-cache", cache, *extra]  # fmt: skip
    return subprocess.run(convmatrix_cmd(*args), cwd=cwd, env=child_env(),
                          capture_output=True, text=True, timeout=LIMIT_S)  # fmt: skip


def _verdicts(url: str, run_id: int) -> dict:
    """Every case's outcome and, per output, its usage, broken zeros, max error and verdict."""
    return {r.case.id: (r.outcome, [_judged(o) for o in r.outputs]) for r in results(url, run_id)}


def _judged(o) -> tuple:
    return (o.output, o.bound_usage, o.broken_zeros, o.e_abs, o.e_rel, o.e_norm, o.passed)


def _entries(root: Path) -> list[Path]:
    return [root / f.sub / f.name for f in CacheDir(root).files() if not f.temporary]


def test_runs_judge_alike_off_cold_warm_and_on_damaged_entries(tmp_path):
    """The smoke matrix with ``torch``: off, cold (fills the cache), warm (reads it), then
    with one byte of every entry flipped (the header, a block, the last byte in turn)."""
    url, root = f"sqlite:///{tmp_path / 'r.db'}", tmp_path / "refs"
    for cache in ("off", str(root), str(root)):
        done = _run(tmp_path, url, cache, matrix="smoke")
        assert done.returncode == 0, done.stdout + done.stderr
    assert not (tmp_path / "off").exists()
    entries = _entries(root)
    assert len(entries) == 22  # the forward cases
    for i, path in enumerate(entries):
        raw = path.read_bytes()
        _flip(path, [64, _payload_start(raw) + 3, len(raw) - 1][i % 3])
    damaged = _run(tmp_path, url, str(root), matrix="smoke")
    assert damaged.returncode == 0, damaged.stdout
    warnings = [x for x in damaged.stdout.splitlines() if "reference cache: warning" in x]
    assert len(warnings) == 1 and "22 entries failed a check" in warnings[0]
    assert _verdicts(url, 1) == _verdicts(url, 2) == _verdicts(url, 3) == _verdicts(url, 4)
    stats = CacheDir(root).stats()
    assert (stats["miss"], stats["hit"], stats["damaged"], stats["stored"]) == (22, 22, 22, 44)
    # A planted entry with a valid checksum: a run believes what its key names, which shows
    # the warm runs above read the cache (the y reference moved by 1.0 fails its case).
    _plant(entries[0], lambda name, r: r + 1.0 if name == "y" else r)
    done = _run(tmp_path, url, str(root), matrix="smoke")
    assert done.returncode == 1 and "1 failed" in done.stdout, done.stdout


def _plant(path: Path, change) -> None:
    """Rewrite the entry at ``path`` with ``change(output, r)`` for each r, checksums valid."""
    raw = path.read_bytes()
    header = json.loads(raw[24 : 24 + int.from_bytes(raw[8:16], "little")])
    key = Key(header["key"], header["text"])
    blocks = list(Entry.open(path, key).blocks())
    for block in blocks:
        block.refs = {name: change(name, r.clone()) for name, r in block.refs.items()}
    write_entry(path, key, blocks)


def test_a_seeded_bug_fails_alike_cold_warm_and_on_damaged_entries(tmp_path):
    """``seeded:halo_off_by_one`` on the smoke matrix: the same cases fail with the same
    usages cold, warm, and with every entry's bounds overwritten by 3.4e38 (damaged
    magnitudes once made it pass with usage 0)."""
    url, root = f"sqlite:///{tmp_path / 'r.db'}", str(tmp_path / "refs")
    kernel = "seeded:halo_off_by_one"
    codes = [_run(tmp_path, url, root, kernel=kernel, matrix="smoke").returncode
             for _ in range(2)]  # fmt: skip
    for path in _entries(Path(root)):
        _inflate_bounds(path)
    damaged = _run(tmp_path, url, root, kernel=kernel, matrix="smoke")
    assert [*codes, damaged.returncode] == [1, 1, 1]
    assert "22 entries failed a check" in damaged.stdout
    cold, warm, after = (_verdicts(url, i) for i in (1, 2, 3))
    assert cold == warm == after
    failed = [v for v in cold.values() if v[0] == "failed"]
    assert failed and max(u for _, outs in failed for _, u, *_ in outs if u) > 2


def _inflate_bounds(path: Path) -> None:
    """Every bound of the entry at ``path`` overwritten with 0x7f bytes (3.4e38 in float32),
    its checksums left as they were."""
    raw = bytearray(path.read_bytes())
    header = json.loads(raw[24 : 24 + int.from_bytes(raw[8:16], "little")])
    start = _payload_start(bytes(raw))
    for block in header["blocks"]:
        for _, part, dtype, shape, offset in block["tensors"]:
            if part == "bound":
                n = int(torch.tensor(shape).prod()) * (4 if dtype == "float32" else 8)
                raw[start + offset : start + offset + n] = b"\x7f" * n
    path.write_bytes(bytes(raw))


@pytest.fixture
def small_disk(tmp_path):
    """A real 96 KiB filesystem (tmpfs; needs root), its space nearly taken."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(mount)],
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        with open(mount / "filler", "wb") as f:  # leave less than an entry
            f.write(b"\0" * (80 << 10))
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_a_full_disk_changes_no_verdict_and_leaves_no_temporary_file(tmp_path, small_disk):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    assert _run(tmp_path, url, "off").returncode == 0
    root = small_disk / "refs"
    done = _run(tmp_path, url, str(root))
    assert done.returncode == 0, done.stdout + done.stderr
    assert _verdicts(url, 1) == _verdicts(url, 2)
    assert CacheDir(root).stats()["write_failed"] >= 1
    assert [f for f in CacheDir(root).files() if f.temporary] == []
    assert "could not be written" in done.stdout


_LIMITED = """
import json, resource, signal, sys
from pathlib import Path
from test_refcache import CASE
from convmatrix.kernels.builtin.framework import TorchKernel
from convmatrix.runners.case.execute import Context, run_case
from convmatrix.runners.case.refcache.cache import ReferenceCache

cache = None
if sys.argv[1] != "off":
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
    cache = ReferenceCache(Path(sys.argv[1]))
result = run_case(CASE, Context(TorchKernel(), reference_cache=cache))
print(json.dumps([result.outcome, [(o.output, o.bound_usage) for o in result.outputs]]))
"""


def test_a_write_that_fails_midway_changes_no_verdict_and_leaves_no_temporary_file(tmp_path):
    """Anywhere, without root: a real file-size limit (RLIMIT_FSIZE) makes the entry's write
    fail after 4 KiB, as a disk that fills does. Both sides in a fresh process (the kernel's
    reductions follow the process's thread count)."""
    root = tmp_path / "refs"
    env = child_env(PYTHONPATH=os.pathsep.join([str(Path(__file__).parent),
                                                os.environ.get("PYTHONPATH", "")]))  # fmt: skip
    judged = []
    for where in ("off", str(root)):
        done = subprocess.run([sys.executable, "-c", _LIMITED, where], capture_output=True,
                              text=True, env=env, timeout=LIMIT_S)  # fmt: skip
        assert done.returncode == 0, done.stderr
        judged.append(json.loads(done.stdout.splitlines()[-1]))
    assert judged[0] == judged[1] and judged[0][0] == "passed"
    assert CacheDir(root).stats()["write_failed"] == 1
    assert list(CacheDir(root).files()) == []  # no entry, no temporary file


def test_eviction_in_a_run_stays_inside_the_cache(tmp_path):
    """A run that must evict (old entries fill the cache past its limit), with a linked
    directory and a linked entry inside: it evicts its own old files, nothing outside."""
    url, root = f"sqlite:///{tmp_path / 'r.db'}", tmp_path / "refs"
    outside, files = _outside(tmp_path)
    (root / "ee").mkdir(parents=True)
    old = [root / "ee" / (f"ee{i:038d}.ref") for i in range(3)]
    for f in old:
        f.write_bytes(b"\0" * (200 << 10))
        os.utime(f, (0, 0))
    os.symlink(outside, root / "ab")
    os.symlink(files[0], root / "ee" / ("ee" + "9" * 38 + ".ref"))
    assert _run(tmp_path, url, "off").returncode == 0
    done = _run(tmp_path, url, str(root), "--reference-cache-size", "100K")
    assert done.returncode == 0, done.stdout + done.stderr
    assert _verdicts(url, 1) == _verdicts(url, 2)
    assert not any(f.exists() for f in old)  # evicted: the least recently used
    assert all(f.read_bytes() == b"keep me" * 100 for f in files)
    assert (root / "ab").is_symlink() and len(_entries(root)) == 3
    shutil.rmtree(root)
