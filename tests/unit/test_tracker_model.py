"""Random adds, clock steps, pops, cancels and restarts, checked against a sorted-list model.

It asserts: nothing is lost, nothing is early (strict), nothing cancelled is returned,
pops are earliest-first and sorted by position, and duplicates appear only after a restart.
"""

from __future__ import annotations

import os

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from raydelay.clock import ManualClock
from raydelay.delayed import (
    BucketDelayedDeliveryTracker,
    InMemoryBucketRegistry,
    InMemoryDelayedDeliveryTracker,
)
from raydelay.errors import StorageError
from raydelay.storage import FaultyObjectStore, MemoryObjectStore

TICK = 5
START = 1_000_000


class TrackerModel(RuleBasedStateMachine):
    kind = "bucket"
    strict = True

    @initialize()
    def setup(self):
        self.clock = ManualClock(START)
        self.store = FaultyObjectStore(MemoryObjectStore())
        self.registry = InMemoryBucketRegistry()
        self.tracker = self._new_tracker()
        self.model: dict[tuple[int, int], int] = {}
        self.delivered: dict[tuple[int, int], int] = {}  # position -> deliver_at it went out with
        self.cancelled: set[tuple[int, int]] = set()
        self.restarts = 0
        self.delivered_before_restart: set[tuple[int, int]] = set()
        self.replayed: set[tuple[int, int]] = set()
        self.earliest: dict[tuple[int, int], int] = {}  # the lowest deliver_at ever tracked
        self.crashes = 0
        self.ledger = 1

    def _new_tracker(self):
        if self.kind == "memory":
            return InMemoryDelayedDeliveryTracker(
                clock=self.clock, tick_time_ms=TICK, strict=self.strict
            )
        return BucketDelayedDeliveryTracker(
            store=self.store,
            registry=self.registry,
            name="subs/t/0/s",
            clock=self.clock,
            tick_time_ms=TICK,
            strict=self.strict,
            min_index_count_per_bucket=5,
            max_time_step_per_segment_ms=40,
            max_indexes_per_segment=3,
            max_num_buckets=2,
        )

    def cutoff(self) -> int:
        return self.clock.now_ms() + (0 if self.strict else TICK)

    @rule(
        items=st.lists(
            st.tuples(st.integers(-2, 1), st.integers(0, 12), st.integers(-30, 400)),
            min_size=1,
            max_size=12,
        ),
        bump=st.booleans(),
    )
    def add(self, items, bump):
        if bump:
            self.ledger += 1
        ls, es, ds = [], [], []
        for dl, entry, delay in items:
            if (max(1, self.ledger + dl), entry) in self.delivered_before_restart:
                continue  # acked before a restart: a subscription never adds it again
            ls.append(max(1, self.ledger + dl))
            es.append(entry)
            ds.append(self.clock.now_ms() + delay if delay > -25 else -1)
        if not ls:
            return
        got = self.tracker.add_messages(ls, es, ds)
        assert len(got) == len(ls)
        cutoff = self.cutoff()
        for i, pos in enumerate(zip(ls, es)):
            d = ds[i]
            if d < 0 or d <= cutoff:
                assert not got[i], f"{pos} due at {d} (cutoff {cutoff}) must be delivered now"
                self.model.pop(pos, None)
                self.replayed.add(pos)  # the caller delivers it now
                self.cancelled.discard(pos)
            else:
                assert got[i]
                if pos not in self.model:
                    self.model[pos] = d
                    self.cancelled.discard(pos)
                    self.earliest[pos] = min(d, self.earliest.get(pos, d))

    @rule(ms=st.integers(0, 120))
    def advance(self, ms):
        self.clock.advance(ms)

    @rule(n=st.integers(0, 20))
    def pop(self, n):
        got = self.tracker.get_scheduled_messages(n)
        assert len(got) <= n
        assert got == sorted(got), "returned positions are sorted by (ledger, entry)"
        assert len(set(got)) == len(got)
        cutoff = self.cutoff()
        for pos in got:
            assert pos not in self.cancelled, f"cancelled {pos} was returned"
            if pos in self.model:
                d = self.model.pop(pos)
                if self.crashes:
                    # a crash loses in-flight re-adds (as it loses nacks): a position may
                    # come back at any time it was given, never before all of them
                    d = min(d, self.earliest[pos])
                assert d <= cutoff, f"{pos} returned early: due {d}, cutoff {cutoff}"
                if self.strict:
                    assert d <= self.clock.now_ms()
                self.delivered[pos] = d
            else:
                assert pos in self.delivered_before_restart, (
                    f"{pos} was never tracked, or came back without a restart"
                )
        due_left = sorted((d, p) for p, d in self.model.items() if d <= cutoff)
        if len(got) < n:
            assert due_left == [], f"due positions left behind: {due_left[:5]}"
        elif got and due_left and self.restarts == 0:
            # earliest first: what is left due is not earlier than what was returned
            latest = max((self.delivered[p], p) for p in got)
            assert due_left[0] >= latest, f"{due_left[0]} left behind while {latest} was returned"

    @precondition(lambda self: self.model)
    @rule(i=st.integers(0, 10_000))
    def cancel_tracked(self, i):
        pos = sorted(self.model)[i % len(self.model)]
        assert self.tracker.remove_message(*pos) is True
        del self.model[pos]
        self.cancelled.add(pos)

    @rule(ledger=st.integers(1, 8), entry=st.integers(0, 12))
    def cancel_any(self, ledger, entry):
        pos = (ledger, entry)
        expected = pos in self.model
        if self.restarts == 0:
            assert self.tracker.remove_message(*pos) is expected
        else:
            self.tracker.remove_message(*pos)
        if expected:
            del self.model[pos]
            self.cancelled.add(pos)

    @precondition(lambda self: self.kind == "bucket")
    @rule(fail_writes=st.integers(0, 5))
    def restart(self, fail_writes):
        if fail_writes:
            self.store.fail_next("put", times=fail_writes)
        try:
            self.tracker.flush()
            lost_cancels = False
        except StorageError:  # its cancels are not durable: as after a crash
            lost_cancels = True
        self.store.reset()
        self._replay()
        if lost_cancels:
            # the subscription re-applies the cancel markers it reads again from the log,
            # as it does after every restart
            for pos in sorted(self.cancelled):
                self.tracker.remove_message(*pos)

    def _replay(self):
        self.tracker = self._new_tracker()
        self.restarts += 1
        self.delivered_before_restart |= set(self.delivered)
        self.delivered_before_restart |= self.replayed
        self.replayed = set()
        # the subscription re-reads the log from mark-delete: every pending position comes again
        if self.model:
            items = sorted(self.model.items())
            got = self.tracker.add_messages(
                [p[0] for p, _ in items], [p[1] for p, _ in items], [d for _, d in items]
            )
            cutoff = self.cutoff()
            for (pos, d), ok in zip(items, got):
                assert ok == (d > cutoff)
                if not ok:  # due by now: the replay hands it out
                    del self.model[pos]
                    self.replayed.add(pos)

    @rule(fail=st.integers(1, 5))
    def failing_writes(self, fail):
        if self.kind != "memory":
            self.store.fail_next("put", times=fail)

    @invariant()
    def counts_agree(self):
        if not hasattr(self, "tracker"):
            return
        n = self.tracker.number_of_delayed_messages()
        if self.restarts == 0:
            assert n == len(self.model)
            for pos in list(self.model)[:5]:
                assert self.tracker.contains_message(*pos)
            for pos in list(self.cancelled)[:5]:
                assert not self.tracker.contains_message(*pos)
        else:
            assert n >= len(self.model)

    def teardown(self):
        if not hasattr(self, "tracker"):
            return
        # nothing is lost: far in the future, every tracked position comes out
        self.store.reset()
        self.clock.advance(10_000)
        out = []
        for _ in range(500):
            batch = self.tracker.get_scheduled_messages(50)
            out += batch
            if not batch:
                break  # an empty pop means nothing due is left
        for pos in out:
            assert pos not in self.cancelled
        missing = set(self.model) - set(out)
        assert not missing, f"lost: {sorted(missing)[:10]}"
        if self.restarts == 0:
            assert len(out) == len(set(out)) == len(self.model)
        self.tracker.close()


SETTINGS = settings(
    max_examples=int(os.environ.get("TRACKER_MODEL_EXAMPLES", "60")),
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


def _machine(kind: str, strict: bool):
    cls = type(f"Model_{kind}_{strict}", (TrackerModel,), {"kind": kind, "strict": strict})
    return cls


@pytest.mark.parametrize("kind", ["memory", "bucket"])
@pytest.mark.parametrize("strict", [True, False])
def test_tracker_matches_the_model(kind, strict):
    machine = _machine(kind, strict)
    machine.TestCase.settings = SETTINGS
    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(machine, settings=SETTINGS)
