"""The timer synchronises and keeps the cold call apart; the model's counts are hand-checked.

No assertion here is a performance target: lower bounds come from ``time.sleep`` semantics
(a sleep of s seconds takes at least s), and what is about which calls are timed (the cold
call, setup) runs on a fake clock, so a loaded machine cannot flip an upper bound.
"""

from __future__ import annotations

import queue
import threading
import time

import pytest

from convmatrix.core.case import Case
from convmatrix.runners.case.timing.measure import Sampling, measure, summarize
from convmatrix.runners.case.timing.perfmodel import (
    Rates,
    backward_work,
    forward_work,
    time_floor,
    update_work,
)

PLAN = Sampling(warmup_min=1, warmup_max=3, repeats_min=3, repeats_max=5, budget_s=0.0)


class FakeAsyncDevice:
    """A CPU 'device' that defers work to a thread: launches return at once, like CUDA."""

    def __init__(self) -> None:
        self.jobs: queue.Queue = queue.Queue()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            seconds = self.jobs.get()
            time.sleep(seconds)
            self.jobs.task_done()

    def launch(self, seconds: float) -> None:
        self.jobs.put(seconds)

    def synchronize(self) -> None:
        self.jobs.join()

    def pending(self) -> int:
        return self.jobs.unfinished_tasks


class PerfClock:
    """A host clock that also notes how much device work was still queued when it stopped."""

    def __init__(self, device: FakeAsyncDevice, log: list[int]) -> None:
        self.device, self.log = device, log

    def start(self) -> None:
        self.t0 = time.perf_counter()

    def stop(self) -> float:
        self.log.append(self.device.pending())
        return time.perf_counter() - self.t0


def test_synchronised_timer_measures_the_deferred_work():
    device = FakeAsyncDevice()
    pending: list[int] = []
    result = measure(
        lambda: device.launch(0.02),
        sync=device.synchronize,
        new_timer=lambda: PerfClock(device, pending),
        sampling=PLAN,
    )
    assert result.min_s >= 0.02  # each region waited for its 20 ms of device work
    assert set(pending) == {0}


def test_naive_timer_would_be_fooled_by_the_same_device():
    # Without synchronisation the clock stops while the work is still queued: the reason the
    # timer synchronises. (Shown on state, not on a duration.)
    device = FakeAsyncDevice()
    pending: list[int] = []
    measure(
        lambda: device.launch(0.02),
        sync=lambda: None,
        new_timer=lambda: PerfClock(device, pending),
        sampling=PLAN,
    )
    assert max(pending) > 0
    device.synchronize()


def test_cold_call_is_recorded_apart_and_setup_is_not_timed():
    """On a fake clock (this is about which calls are timed, not about the clock): the first
    call "compiles" for 100 units, every later one takes 1, and setup takes 1000 before each
    call. Every number below is exact."""
    now = [0.0]
    calls = {"fn": 0, "setup": 0}

    def fn() -> None:
        calls["fn"] += 1
        now[0] += 100.0 if calls["fn"] == 1 else 1.0

    def setup() -> None:
        calls["setup"] += 1
        now[0] += 1000.0  # e.g. restoring the decode state: outside the timed region

    class Clock:
        def start(self):
            self.t0 = now[0]

        def stop(self):
            return now[0] - self.t0

    result = measure(
        fn, sync=lambda: None, new_timer=Clock, sampling=PLAN, setup=setup, mode="reset"
    )
    assert result.cold_s == 100.0  # the cold call alone, without its setup
    assert result.samples == [1.0] * result.n  # neither the cold call nor any setup
    assert result.min_s == result.median_s == 1.0 and result.iqr_s == 0.0
    assert calls["setup"] == calls["fn"]  # setup before every call
    assert PLAN.repeats_min <= result.n <= PLAN.repeats_max
    assert result.mode == "reset"


def test_summarize_median_min_iqr():
    # quartiles (inclusive method) of 1..9 are 3 and 7
    assert summarize([9, 1, 5, 3, 7, 2, 8, 4, 6]) == (5, 1, 4)
    assert summarize([2.5]) == (2.5, 2.5, 0.0)


def _case(**kw):
    base = dict(
        suite="perf",
        op="fwd",
        width=4,
        dim=8,
        batch=2,
        seqlen=16,
        x_dtype="float16",
        w_dtype="float32",
        activation="silu",
        bias=True,
        initial_state="random",
        final_state=True,
        dfinal="random",
    )
    base.update(kw)
    return Case(**base)


def test_forward_work_hand_checked():
    work = forward_work(_case())
    # per output: z = 4 mul + 3 add + 1 bias = 8, SiLU 4 -> 12 flops; B*C*L = 2*8*16 = 256
    assert work.flops == 256 * 12
    # x and y: 2 * 256 * 2 B = 1024; weight 8*4*4 = 128; bias 8*4 = 32;
    # initial and final state: 2 * (2*8*3*2) = 192  -> 1376
    assert work.bytes == 1024 + 128 + 32 + 192


def test_backward_work_hand_checked():
    work = backward_work(_case())
    # per element: dx 7 + dw 8 + db 1 + recomputed z 8 + SiLU' 8 = 32 over 256 elements;
    # dF adds 2*8*3 = 48
    assert work.flops == 256 * 32 + 48
    # x, g, dx: 3*256*2 = 1536; weight in + dw out: 2*128 = 256; bias in + db out: 64;
    # initial state in + dS out: 2*96 = 192; q in: 96
    assert work.bytes == 1536 + 256 + 64 + 192 + 96


def test_update_work_hand_checked():
    case = _case(
        op="update",
        seqlen=None,
        tokens=2,
        steps=3,
        state_len=5,
        circular=False,
        initial_state=None,
        final_state=None,
        dfinal=None,
        activation=None,
        bias=False,
    )
    work = update_work(case)
    # per new token: 4 mul + 3 add = 7 over B*C*T = 2*8*2 = 32 tokens
    assert work.flops == 32 * 7
    # x in + y out: 2*32*2 = 128; weight 128; history 2*8*3*2 = 96; shift rewrites 2*(2*8*5*2)=320
    assert work.bytes == 128 + 128 + 96 + 320
    ring = update_work(Case(**{**case.canonical(), "circular": True}))
    # ring: only the 2 new tokens are written (2*8*2*2 = 64) plus int32 cache_seqlens (2*4)
    assert ring.bytes == 128 + 128 + 96 + 64 + 8


@pytest.mark.parametrize("flops, nbytes, expected", [(1e9, 1e6, 0.1), (1e6, 1e9, 0.5)])
def test_lower_bound_is_the_larger_of_compute_and_traffic(flops, nbytes, expected):
    from convmatrix.runners.case.timing.perfmodel import Work

    assert time_floor(Work(flops, nbytes), Rates(bandwidth=2e9, compute=1e10)) == pytest.approx(
        expected
    )
