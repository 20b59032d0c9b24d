"""The parking room of a queue loop (``foundry.deliver.limits.ParkingRoom``): jobs of a
scope ask again in the order they came, one head at a time, when their turn is due."""

from __future__ import annotations

import time

from foundry.deliver.limits import ParkingRoom

A, B = ("u", "a"), ("u", "b")


def test_a_scope_asks_in_order_one_head_at_a_time() -> None:
    room: ParkingRoom[str] = ParkingRoom(cap=10)
    room.park(A, "a1", 0.0, since=1.0)
    room.park(A, "a2", 0.0, since=2.0, keep_turn=True)
    time.sleep(0.002)
    assert room.take_due() == (A, "a1", 1.0)
    assert room.take_due() is None  # a1 is being asked for: a2 waits for its answer
    assert room.waiting(A)
    room.answered(A, 0.0)  # a1 was granted
    assert room.take_due() == (A, "a2", 2.0)
    room.answered(A, 0.0)
    assert not room.waiting(A)
    assert room.count == 0


def test_a_refused_head_goes_back_first_and_waits_its_time() -> None:
    room: ParkingRoom[str] = ParkingRoom(cap=10)
    room.park(A, "a1", 0.0, since=1.0)
    room.park(A, "a2", 0.0, since=2.0, keep_turn=True)
    time.sleep(0.002)
    head = room.take_due()
    assert head == (A, "a1", 1.0)
    room.park(A, head[1], 30.0, since=head[2], front=True)  # refused: a token in 30 s
    assert room.take_due() is None
    assert 29 < (room.next_due() or 0) <= 30
    room.wake(A)  # a slot of the scope was freed here
    assert room.take_due() == (A, "a1", 1.0)


def test_scopes_do_not_wait_for_each_other() -> None:
    room: ParkingRoom[str] = ParkingRoom(cap=10)
    room.park(A, "a1", 60.0, since=0.0)
    room.park(B, "b1", 0.0, since=0.0)
    time.sleep(0.002)
    assert room.take_due() == (B, "b1", 0.0)
    assert room.take_due() is None


def test_remove_and_drain_empty_the_room() -> None:
    room: ParkingRoom[str] = ParkingRoom(cap=10)
    for i in range(3):
        room.park(A, f"a{i}", 5.0, since=float(i), keep_turn=True)
    room.park(B, "b0", 5.0, since=9.0)
    assert room.remove("a1") == 1.0
    assert room.remove("nope") is None
    assert room.count == 3
    assert sorted(room.drain()) == [("a0", 0.0), ("a2", 2.0), ("b0", 9.0)]
    assert room.count == 0
    assert room.next_due() is None
    assert not room.waiting(A)
