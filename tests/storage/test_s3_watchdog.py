"""The deadlines of S3 reads under way: a cut at its time, and no growth with reads ended."""

from __future__ import annotations

import threading

from simstore.storage._s3_watchdog import _WATCHDOG, cut_at


def test_a_read_past_its_deadline_is_cut_and_one_that_ended_is_not():
    fired = threading.Event()
    with cut_at(0.0, fired.set):
        assert fired.wait(60)  # a liveness bound
    ended = []
    with cut_at(0.05, lambda: ended.append(1)):
        pass
    later = threading.Event()
    with cut_at(0.2, later.set):  # a deadline ahead fires too: the thread waits for it
        assert later.wait(60)
    assert ended == []  # the read that ended before its deadline was never cut


def test_reads_that_ended_do_not_pile_up_until_their_deadlines():
    # a busy process makes thousands of reads a second, each with a deadline minutes on;
    # one long read under way holds the top of the heap, so none of the ended ones reach it
    with cut_at(3000.0, lambda: None):
        for _ in range(20_000):
            with cut_at(3600.0, lambda: None):
                pass
        with _WATCHDOG._cond:
            assert len(_WATCHDOG._heap) <= 2 * 1024 + 2


def test_a_read_that_ends_while_its_cut_runs_waits_for_the_cut():
    # a cut under way when its read ends finishes before the block is left: what follows
    # the read (the next read of a body kept open, the connection's next request) is not cut
    started, go, order = threading.Event(), threading.Event(), []

    def cut():
        started.set()
        go.wait(60)
        order.append("cut")

    def release_after_a_while():
        started.wait(60)
        threading.Event().wait(0.3)
        go.set()

    helper = threading.Thread(target=release_after_a_while)
    helper.start()
    with cut_at(0.0, cut):
        assert started.wait(60)
    order.append("left")
    helper.join(60)
    assert order == ["cut", "left"]
