"""One Watch stream over a key range, read by its own thread, which stamps
each event's key with the time its response arrived. The replication-lag
measurements share it: test_cluster_wake.py and bench/scripts/probe.py
(which runs against etcd too, so this module needs nothing but grpc and
the caller's generated messages)."""

import queue
import threading
import time


class WatchTimer:
    def __init__(self, channel, request, create_request, response, key, range_end,
                 timeout=120.0):
        self._reqs = queue.Queue()
        self._reqs.put(request(create_request=create_request(key=key, range_end=range_end)))
        self._events = queue.Queue()
        self._created = threading.Event()
        call = channel.stream_stream("/etcdserverpb.Watch/Watch",
                                     request_serializer=lambda x: x.SerializeToString(),
                                     response_deserializer=response.FromString)
        self._stream = call(self._requests(), timeout=timeout)
        threading.Thread(target=self._read, daemon=True).start()

    def _requests(self):
        while True:
            r = self._reqs.get()
            if r is None:
                return
            yield r

    def _read(self):
        try:
            for resp in self._stream:
                now = time.perf_counter_ns()
                if resp.created:
                    self._created.set()
                for ev in resp.events:
                    self._events.put((ev.kv.key, now))
        except Exception:  # noqa: BLE001  the stream ends when the caller closes it
            pass

    def created(self, timeout):
        """True once the server has answered the create request."""
        return self._created.wait(timeout)

    def arrival(self, key, timeout=10.0):
        """perf_counter_ns() when the event for |key| arrived; events for other
        keys before it are dropped. queue.Empty after |timeout| seconds."""
        while True:
            k, t = self._events.get(timeout=timeout)
            if k == key:
                return t

    def close(self):
        self._reqs.put(None)
        self._stream.cancel()
