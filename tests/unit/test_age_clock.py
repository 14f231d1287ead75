"""The writer's clock does not follow a step of the wall clock, ahead or back, at once."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from storage.age_clock import (
    SLACK_MS,
    TRUST_AFTER_S,
    AgeClock,
    SharedClock,
    decode_anchor,
    encode_anchor,
)
from storage.env import Storage


class Clocks:
    def __init__(self) -> None:
        self.wall_ms = 1_795_000_000_000
        self.steady_s = 100.0

    def pass_s(self, seconds: float) -> None:
        self.wall_ms += int(seconds * 1000)
        self.steady_s += seconds


def test_a_wall_clock_that_keeps_pace_is_believed() -> None:
    clocks = Clocks()
    age = AgeClock(lambda: clocks.wall_ms, lambda: clocks.steady_s)
    assert age() == clocks.wall_ms
    clocks.pass_s(30)
    assert age() == clocks.wall_ms
    clocks.wall_ms += SLACK_MS  # slewing within the slack
    assert age() == clocks.wall_ms


def test_a_forward_step_is_believed_only_once_it_has_held(caplog: pytest.LogCaptureFixture) -> None:
    clocks = Clocks()
    age = AgeClock(lambda: clocks.wall_ms, lambda: clocks.steady_s)
    start = age()
    clocks.wall_ms += 8 * 86_400_000  # eight days ahead, with no time passing
    with caplog.at_level(logging.WARNING, logger="collector.storage"):
        assert age() == start
        clocks.pass_s(65)
        assert age() == start + 65_000  # real time goes on
        clocks.wall_ms -= 8 * 86_400_000  # put back: believed at once
        assert age() == clocks.wall_ms == start + 65_000
        clocks.wall_ms += 8 * 86_400_000  # and ahead again, for good this time
        assert age() == start + 65_000
        clocks.pass_s(TRUST_AFTER_S - 1)
        assert age() == start + 65_000 + int((TRUST_AFTER_S - 1) * 1000)
        clocks.pass_s(1)
        assert age() == clocks.wall_ms  # it held for TRUST_AFTER_S
    said = [record.getMessage() for record in caplog.records]
    assert len(said) == 3 and "stepped +691200 s away" in said[0] and "believed from now on" in said[2], said


def test_a_step_back_is_not_stamped_and_is_believed_once_it_has_held() -> None:
    # helper-112: records stamped during a step back looked eight days older once it
    # was corrected, and their retries were stored again
    clocks = Clocks()
    age = AgeClock(lambda: clocks.wall_ms, lambda: clocks.steady_s)
    start = age()
    clocks.wall_ms -= 8 * 86_400_000
    clocks.pass_s(1)
    assert age() == start + 1_000
    clocks.wall_ms += 8 * 86_400_000  # corrected: nothing to believe, it is where time is
    clocks.pass_s(1)
    assert age() == clocks.wall_ms == start + 2_000
    clocks.wall_ms -= 3_600_000  # an hour back, for good
    assert age() == start + 2_000
    clocks.pass_s(TRUST_AFTER_S)
    assert age() == clocks.wall_ms


def test_a_new_process_starts_from_the_recorded_anchor_of_its_boot() -> None:
    # helper-111: a worker restarted during a jump believed it at once, and its sweep
    # removed every stored event
    clocks = Clocks()
    first = AgeClock(lambda: clocks.wall_ms, lambda: clocks.steady_s)
    start = first()
    clocks.pass_s(30)
    anchor = first.anchor()
    assert anchor == (start + 30_000, clocks.steady_s)
    boot = b"6f1c2e8a-0000-4000-8000-000000000000"
    recorded = encode_anchor(anchor, boot)
    assert decode_anchor(recorded, b"another-boot") is None and decode_anchor(None, boot) is None
    clocks.wall_ms += 8 * 86_400_000  # the jump; then the restart
    clocks.pass_s(5)
    restarted = AgeClock(lambda: clocks.wall_ms, lambda: clocks.steady_s, seed=decode_anchor(recorded, boot))
    assert restarted() == start + 35_000


def test_a_second_step_while_the_first_is_waited_out_starts_the_wait_again() -> None:
    # helper-116: a day's step, then a week's 599 s later, was believed a second after the second
    clocks = Clocks()
    age = AgeClock(lambda: clocks.wall_ms, lambda: clocks.steady_s)
    start = age()
    clocks.wall_ms += 86_400_000
    assert age() == start
    clocks.pass_s(TRUST_AFTER_S - 1)
    clocks.wall_ms += 7 * 86_400_000
    assert age() == start + int((TRUST_AFTER_S - 1) * 1000)
    clocks.pass_s(TRUST_AFTER_S - 1)
    assert age() == start + int(2 * (TRUST_AFTER_S - 1) * 1000)  # still real time
    clocks.pass_s(1)
    assert age() == clocks.wall_ms  # the second step held its 10 minutes



def test_a_wall_clock_running_fast_is_not_followed(caplog: pytest.LogCaptureFixture) -> None:
    # helper-121: read once a second, a clock gaining 3 s a second stayed inside the slack of
    # each last reading, and was followed 135 s ahead in 45 s without a word
    clocks = Clocks()
    age = AgeClock(lambda: clocks.wall_ms, lambda: clocks.steady_s)
    start = age()
    with caplog.at_level(logging.WARNING, logger="collector.storage"):
        for _ in range(45):
            clocks.pass_s(1)
            clocks.wall_ms += 3_000
            stamped = age()
    real = start + 45_000
    assert real <= stamped <= real + SLACK_MS, (stamped - real)
    assert any("stepped" in record.getMessage() for record in caplog.records)


def test_the_step_believed_is_said_with_its_size(caplog: pytest.LogCaptureFixture) -> None:
    clocks = Clocks()
    age = AgeClock(lambda: clocks.wall_ms, lambda: clocks.steady_s)
    age()
    clocks.wall_ms += 86_400_000
    with caplog.at_level(logging.WARNING, logger="collector.storage"):
        age()
        clocks.pass_s(30)
        clocks.wall_ms += 7 * 86_400_000  # (its own warning is within the minute's throttle)
        age()
        clocks.pass_s(TRUST_AFTER_S)
        assert age() == clocks.wall_ms
    assert "stayed +691200 s away" in caplog.records[-1].getMessage(), caplog.text


def test_every_process_stamps_with_the_time_worker_0_decides(tmp_path: Path) -> None:
    # helper-121: a worker restarted during an 8-day step went on distrusting it after worker
    # 0 believed it, and worker 0's sweep removed that worker's new records at once. The
    # others now take worker 0's time, published in meta, inside their own transaction.
    storage = Storage(tmp_path)
    clocks = Clocks()
    decider = AgeClock(lambda: clocks.wall_ms, lambda: clocks.steady_s)
    worker0 = SharedClock(decider, b"boot-1", decides=True)

    def stamp(clock: SharedClock) -> int:
        with storage.env.begin(write=True) as txn:
            return clock.now_in(txn, storage.dbs.meta)

    start = stamp(worker0)
    clocks.wall_ms += 8 * 86_400_000  # the step
    clocks.pass_s(60)
    assert stamp(worker0) == start + 60_000  # distrusted
    # worker 1, restarted during the step, starts from the anchor and distrusts it too
    restarted = AgeClock(lambda: clocks.wall_ms, lambda: clocks.steady_s, seed=decider.anchor())
    worker1 = SharedClock(restarted, b"boot-1", decides=False)
    clocks.pass_s(300)
    assert stamp(worker1) == start + 360_000 == stamp(worker0)
    clocks.pass_s(TRUST_AFTER_S - 300)
    believed = stamp(worker0)  # worker 0 has waited its 10 minutes: believed, and published
    assert believed == clocks.wall_ms
    assert abs(stamp(worker1) - believed) <= 1  # at once, in worker 1's next transaction
    assert restarted() < believed - 86_400_000  # (its own guard would still distrust it)
    clocks.pass_s(30)
    assert abs(stamp(worker1) - clocks.wall_ms) <= 1


def test_a_publication_rolled_back_is_made_again(tmp_path: Path) -> None:
    # helper-124: what was published was remembered, not read back; a transaction aborted
    # and redone after worker 0 believed a step published nothing, and the others stamped
    # the old time until the next sweep
    storage = Storage(tmp_path)
    clocks = Clocks()
    decider = AgeClock(lambda: clocks.wall_ms, lambda: clocks.steady_s)
    worker0 = SharedClock(decider, b"boot-1", decides=True)
    worker1 = SharedClock(AgeClock(lambda: clocks.wall_ms, lambda: clocks.steady_s), b"boot-1", decides=False)
    with storage.env.begin(write=True) as txn:
        worker0.now_in(txn, storage.dbs.meta)
    clocks.wall_ms += 8 * 86_400_000
    clocks.pass_s(1)
    with storage.env.begin(write=True) as txn:
        worker0.now_in(txn, storage.dbs.meta)  # the step seen: distrusted
    clocks.pass_s(TRUST_AFTER_S)
    txn = storage.env.begin(write=True)
    believed = worker0.now_in(txn, storage.dbs.meta)  # believed, and published ...
    txn.abort()  # ... in a transaction that did not commit
    with storage.env.begin(write=True) as txn:
        assert worker0.now_in(txn, storage.dbs.meta) == believed  # published again
    with storage.env.begin(write=True) as txn:
        assert abs(worker1.now_in(txn, storage.dbs.meta) - believed) <= 1
