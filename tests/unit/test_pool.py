"""The shared pool's draw: slots by weight, within each lane's room, no starvation."""

import collections
from typing import Any

from django_dbworker.runtime.pool import Pool


class FakeLane:
    def __init__(self, label, weight, room=10**9, busy=0):
        self.label = label
        self.weight = weight
        self.room = room
        self.busy = busy
        self.num_handlers = room

    def free_slots(self):
        return self.room

    def __repr__(self):
        return self.label


def tally(pool, lanes, draws, slots=1):
    got = collections.Counter()
    for _ in range(draws):
        for lane, count in pool.draw(lanes, slots):
            got[lane.label] += count
    return got


def test_slots_go_by_weight():
    lanes = [FakeLane("a", 1), FakeLane("b", 10), FakeLane("c", 100)]
    got = tally(Pool(8), lanes, 1110)
    assert got == {"a": 10, "b": 100, "c": 1000}  # exact: a weighted round robin


def test_slots_drawn_together_keep_the_shares():
    lanes = [FakeLane("a", 1), FakeLane("b", 10), FakeLane("c", 100)]
    got = tally(Pool(8), lanes, 185, slots=6)
    assert got == {"a": 10, "b": 100, "c": 1000}


def test_a_light_lane_is_never_starved():
    lanes: list[Any] = [*(FakeLane(f"h{i}", 1000) for i in range(5)), FakeLane("light", 1)]
    got = tally(Pool(64), lanes, 2 * 5001)
    assert got["light"] == 2  # one slot in every 5,001 draws, however heavy the others


def test_a_lane_gets_no_more_than_its_room_and_the_rest_go_elsewhere():
    full = FakeLane("capped", 100, room=2)
    other = FakeLane("other", 1)
    lanes: list[Any] = [full, other]
    drawn = dict(Pool(8).draw(lanes, 8))
    assert drawn == {full: 2, other: 6}


def test_shares_count_the_claims():
    lanes = [FakeLane("a", 1), FakeLane("b", 3)]
    pool = Pool(4)
    pool.attach(lanes)
    pool.claimed(lanes[0], 25)
    pool.claimed(lanes[1], 75)
    assert pool.shares() == {"a": 0.25, "b": 0.75}
    report = pool.report()
    assert report["size"] == 4
    assert report["handlers"]["b"] == {"weight": 3, "ceiling": 10**9, "busy": 0, "share": 0.75}
