"""One clock for both threads, and the intervals recorded on it.

Every interval is (lane, name, start_ns, end_ns, args) on `time.perf_counter_ns`,
which both threads share. `chrome_trace()` writes the Chrome trace event
format that Perfetto opens: complete events (`ph: "X"`, `ts`/`dur` in µs),
one thread lane each for target, draft and channel.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass

LANES = {"target": 1, "draft": 2, "channel": 3}


def now_ns() -> int:
    return time.perf_counter_ns()


@dataclass
class Interval:
    lane: str
    name: str
    start_ns: int
    end_ns: int
    args: dict

    @property
    def dur_ns(self) -> int:
        return self.end_ns - self.start_ns


class Timeline:
    """Thread-safe list of intervals."""

    def __init__(self):
        self._lock = threading.Lock()
        self.intervals: list[Interval] = []
        self.origin_ns = now_ns()

    def add(self, lane: str, name: str, start_ns: int, end_ns: int, **args) -> Interval:
        iv = Interval(lane, name, start_ns, end_ns, args)
        with self._lock:
            self.intervals.append(iv)
        return iv

    def span(self, lane: str, name: str, **args):
        """Context manager recording the block as one interval."""
        return _Span(self, lane, name, args)

    def chrome_trace(self, label: str = "Duet Mirror-SD") -> dict:
        with self._lock:
            ivs = list(self.intervals)
        events = [{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": label}}]
        for lane, tid in LANES.items():
            events.append(
                {"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": lane}}
            )
        for iv in sorted(ivs, key=lambda i: i.start_ns):
            events.append(
                {
                    "name": iv.name,
                    "ph": "X",
                    "pid": 1,
                    "tid": LANES[iv.lane],
                    "ts": (iv.start_ns - self.origin_ns) / 1e3,
                    "dur": iv.dur_ns / 1e3,
                    "args": {
                        k: v for k, v in iv.args.items() if isinstance(v, int | float | str | bool)
                    },
                }
            )
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def write(self, path, label: str = "Duet Mirror-SD") -> None:
        with open(path, "w") as f:
            json.dump(self.chrome_trace(label), f)


class _Span:
    def __init__(self, tl: Timeline, lane: str, name: str, args: dict):
        self.tl, self.lane, self.name, self.args = tl, lane, name, args

    def __enter__(self):
        self.t0 = now_ns()
        return self

    def __exit__(self, *exc):
        self.interval = self.tl.add(self.lane, self.name, self.t0, now_ns(), **self.args)
        return False
