"""The budget clock against a fake time source: the organisers' accounting, exactly."""

from __future__ import annotations

import pytest

from trnfrontier.runtime.clock import BudgetClock


class FakeTime:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make_clock(t: FakeTime, **kw) -> BudgetClock:
    args = dict(
        budget_seconds=100.0,
        startup_steps_excluded=2,
        startup_allowance_cap_seconds=10.0,
        checkpoint_reserve_seconds=5.0,
    )
    args.update(kw)
    return BudgetClock(time_fn=t, **args)


def run_steps(clock: BudgetClock, t: FakeTime, durations: list[float], first_step: int = 1) -> None:
    for i, d in enumerate(durations):
        clock.step_started()
        t.advance(d)
        clock.boundary(first_step + i)


def test_startup_within_cap_is_excluded() -> None:
    t = FakeTime()
    clock = make_clock(t)
    run_steps(clock, t, [4.0, 3.0])  # startup = 7 s < cap 10
    assert clock.startup_seconds() == pytest.approx(7.0)
    assert clock.charged_seconds() == pytest.approx(0.0)
    run_steps(clock, t, [1.0, 1.0], first_step=3)
    s = clock.summary()
    assert s["startup_seconds"] == pytest.approx(7.0)
    assert s["charged_seconds"] == pytest.approx(2.0)
    assert s["headroom_seconds"] == pytest.approx(98.0)
    assert s["over_budget"] is False


def test_startup_excess_over_cap_is_charged() -> None:
    t = FakeTime()
    clock = make_clock(t)
    run_steps(clock, t, [12.0, 3.0])  # startup 15 s, cap 10 -> 5 s charged
    assert clock.charged_seconds() == pytest.approx(5.0)
    run_steps(clock, t, [2.0], first_step=3)
    s = clock.summary()
    assert s["startup_seconds"] == pytest.approx(15.0)
    assert s["excluded_seconds"] == pytest.approx(10.0)
    assert s["charged_seconds"] == pytest.approx(7.0)


def test_charged_while_still_in_startup_counts_only_the_excess() -> None:
    t = FakeTime()
    clock = make_clock(t)
    run_steps(clock, t, [8.0])  # one of two startup steps done
    assert clock.in_startup
    assert clock.charged_seconds() == 0.0
    t.advance(4.0)  # 12 s into startup: 2 s over the cap
    assert clock.charged_seconds() == pytest.approx(2.0)


def test_start_time_from_prepare_is_used() -> None:
    t = FakeTime(1000.0)
    clock = make_clock(t, start_time=990.0)  # the process started 10 s before the clock
    run_steps(clock, t, [1.0, 1.0])
    assert clock.startup_seconds() == pytest.approx(12.0)
    assert clock.charged_seconds() == pytest.approx(2.0)


def test_boundary_calls_the_recorder() -> None:
    t = FakeTime()
    seen: list[int] = []
    clock = make_clock(t, on_boundary=seen.append)
    run_steps(clock, t, [1.0, 1.0, 1.0])
    assert seen == [1, 2, 3]


def test_stops_before_the_budget_keeping_the_reserve() -> None:
    t = FakeTime()
    clock = make_clock(t)
    step = 0
    while not clock.should_stop():
        step += 1
        clock.step_started()
        t.advance(
            30.0 if step <= 2 else (1.0 if step % 7 else 3.0)
        )  # startup compile, then jittery steps
        clock.boundary(step)
        t.advance(0.05)  # logging between steps is charged too
        assert step < 10_000
    s = clock.summary()
    # Not over, and the reserve is still there for the final checkpoint.
    assert s["over_budget"] is False
    assert s["charged_seconds"] + 5.0 <= 100.0
    # ... and not much more than one long step earlier than necessary.
    assert s["charged_seconds"] >= 100.0 - 5.0 - 2 * 3.0 - 0.1
    # The startup excess (60 s startup vs 10 s cap) was charged.
    assert s["startup_seconds"] == pytest.approx(60.05)


def test_startup_steps_do_not_inflate_the_step_estimate() -> None:
    t = FakeTime()
    clock = make_clock(t, startup_allowance_cap_seconds=1000.0)
    run_steps(clock, t, [200.0, 1.0, 1.0])  # a long compile step in startup
    assert clock.longest_recent_step() == pytest.approx(1.0)


def test_a_long_first_step_within_the_allowance_does_not_stop_a_short_run() -> None:
    """A compile-heavy first step longer than the whole budget: the next step is still a
    startup step, excluded, so the run goes on; past the allowance it counts."""
    t = FakeTime()
    clock = make_clock(t, budget_seconds=100.0, startup_steps_excluded=3, startup_allowance_cap_seconds=400.0)
    run_steps(clock, t, [200.0])
    assert clock.in_startup and clock.next_step_charge() == 0.0 and not clock.should_stop()
    clock = make_clock(t, budget_seconds=100.0, startup_steps_excluded=3, startup_allowance_cap_seconds=250.0)
    run_steps(clock, t, [200.0])  # 50 s of allowance left: a 200 s step would charge 150 s
    assert clock.next_step_charge() == pytest.approx(150.0) and clock.should_stop()


def test_time_between_steps_is_charged_but_not_a_step() -> None:
    t = FakeTime()
    clock = make_clock(t, startup_steps_excluded=0, startup_allowance_cap_seconds=0.0)
    run_steps(clock, t, [1.0])
    t.advance(20.0)  # a periodic eval
    run_steps(clock, t, [1.0], first_step=2)
    assert clock.longest_recent_step() == pytest.approx(1.0)
    assert clock.charged_seconds() == pytest.approx(22.0)


def test_zero_excluded_steps_end_startup_at_the_first_boundary() -> None:
    """prepare.budget_accounting's rule: startup runs to the first boundary with step >= 0."""
    t = FakeTime()
    clock = make_clock(t, startup_steps_excluded=0)
    run_steps(clock, t, [5.0, 1.0])
    assert clock.summary()["startup_seconds"] == pytest.approx(5.0)
    assert clock.charged_seconds() == pytest.approx(1.0)


def test_zero_cap_charges_everything() -> None:
    t = FakeTime()
    clock = make_clock(t, startup_allowance_cap_seconds=0.0)
    run_steps(clock, t, [5.0, 1.0, 1.0])
    assert clock.charged_seconds() == pytest.approx(7.0)


def test_resumed_clock_adds_prior_charge_and_shrinks_the_cap() -> None:
    t = FakeTime()
    clock = make_clock(t, prior_charged_seconds=40.0, prior_excluded_seconds=8.0)
    run_steps(clock, t, [5.0, 1.0])  # startup 6 s, only 2 s of cap left
    assert clock.charged_seconds() == pytest.approx(44.0)
    assert clock.summary()["excluded_seconds"] == pytest.approx(10.0)


def test_progress_reaches_one_at_the_reserve() -> None:
    t = FakeTime()
    clock = make_clock(t, startup_allowance_cap_seconds=0.0)
    t.advance(47.5)
    assert clock.progress() == pytest.approx(0.5)
    t.advance(100.0)
    assert clock.progress() == 1.0


def test_over_budget_is_reported() -> None:
    t = FakeTime()
    clock = make_clock(t, startup_allowance_cap_seconds=0.0)
    run_steps(clock, t, [150.0])
    s = clock.summary()
    assert s["over_budget"] is True
    assert s["headroom_seconds"] == pytest.approx(-50.0)


@pytest.mark.parametrize("excluded,cap", [(5, 900.0), (5, 3.0), (0, 900.0), (2, 0.0), (50, 10.0)])
def test_matches_prepare_budget_accounting_exactly(
    prepare_module, tmp_path, monkeypatch, excluded, cap
) -> None:
    """Drive prepare.record_step_boundary and the clock from one fake time source, then
    compare the clock's numbers with prepare.budget_accounting over the step log."""
    import random
    import time as time_module

    t = FakeTime(prepare_module.PROCESS_START_TIME + 0.25)
    monkeypatch.setattr(time_module, "time", t)
    log = tmp_path / "steps.jsonl"
    monkeypatch.setenv("TRNF_STEP_LOG", str(log))
    monkeypatch.setattr(prepare_module, "_step_log_started", set())
    clock = BudgetClock(
        60.0,
        excluded,
        cap,
        2.0,
        time_fn=t,
        on_boundary=lambda completed: prepare_module.record_step_boundary(completed - 1),  # 0-based, as the trainer
        start_time=prepare_module.PROCESS_START_TIME,
    )
    rng = random.Random(excluded)
    for step in range(1, 21):
        clock.step_started()
        t.advance(rng.uniform(0.5, 4.0) if step > 3 else 2.5)
        clock.boundary(step)
        t.advance(rng.uniform(0.0, 0.2))
    theirs = prepare_module.budget_accounting(log, budget=60.0, steps_excluded=excluded, cap=cap)
    ours = clock.summary()
    for key in (
        "startup_seconds",
        "excluded_seconds",
        "charged_seconds",
        "headroom_seconds",
        "over_budget",
    ):
        assert ours[key] == theirs[key], key


def test_process_start_time_is_in_the_past() -> None:
    import sys
    import time as time_module

    from trnfrontier.runtime.clock import process_start_time

    started = process_start_time()
    if not sys.platform.startswith("linux"):
        assert started is None
        return
    assert started is not None and 0 <= time_module.time() - started < 7 * 24 * 3600
