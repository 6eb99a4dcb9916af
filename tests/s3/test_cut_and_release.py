"""A body's cut (the watchdog's, at its read's deadline) and the return of its connection
to the pool take turns: a cut that has found the socket holds the return back until it is
done, so it never shuts a connection that another request has taken from the pool.

Against moto on 127.0.0.1.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from simstore.storage import _s3_watchdog
from simstore.storage._s3_watchdog import cut_body, guard_release

pytestmark = pytest.mark.s3

FAST: dict[str, Any] = {"backoff_base_s": 0.001, "backoff_max_s": 0.005, "read_timeout_s": 10}


def test_a_cut_that_found_the_socket_holds_back_the_connections_return(store, monkeypatch):
    payload = bytes(range(200))
    store.put("a", payload)
    response = store._api.get_object(Bucket=store.bucket, Key=store._object_key("a"))
    body = guard_release(response["Body"])
    assert body.read(len(payload) - 1) == payload[:-1]
    found, go = threading.Event(), threading.Event()
    sockets = []
    real = _s3_watchdog._socket_of

    def found_then_wait(b):
        sock = real(b)
        sockets.append(sock)
        found.set()
        go.wait(60)
        return sock

    monkeypatch.setattr(_s3_watchdog, "_socket_of", found_then_wait)
    cutter = threading.Thread(target=cut_body, args=(body,))
    cutter.start()
    assert found.wait(60)
    last = []
    reader = threading.Thread(target=lambda: last.append(body.read()))
    reader.start()
    reader.join(2.0)  # without the lock it returns the connection at once
    held_back = reader.is_alive()  # its last byte read, its connection not yet returned
    go.set()
    cutter.join(60)
    reader.join(60)
    monkeypatch.undo()
    assert sockets and sockets[0] is not None  # the cut found the socket under the body
    assert held_back
    assert last == [payload[-1:]]


def test_a_guarded_body_is_freed_when_dropped_not_by_the_cycle_collector(store):
    # the guard on the response holds it weakly: a strong reference kept on the response
    # made a cycle, which kept the body (and a socket not returned) until a collection
    import gc
    import weakref

    store.put("b", b"0123456789")
    gc.collect()
    gc.disable()
    try:
        response = store._api.get_object(Bucket=store.bucket, Key=store._object_key("b"))
        body = guard_release(response["Body"])
        assert body.read() == b"0123456789"
        raw = weakref.ref(body._raw_stream)
        del body, response
        assert raw() is None
    finally:
        gc.enable()
