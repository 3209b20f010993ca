"""``GET /metrics``: Prometheus text exposition 0.0.4, standard library only.

Counters live for the process; gauges are computed per scrape by the caller and
passed to ``render``. The request histogram is keyed by the route *template*, so a
path parameter never explodes the label set.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Mapping

__all__ = ["BUCKETS", "CONTENT_TYPE", "Metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


# The methods the request histogram names; any other token a client sends (``curl -X FOO1``)
# is counted as "other", so no request can add a series of its own.
_KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE"})
OTHER_METHOD = "other"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(**labels: str) -> str:
    return "{" + ",".join(f'{key}="{_escape(str(value))}"' for key, value in labels.items()) + "}"


def _number(value: float) -> str:
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class Metrics:
    """The coordinator's counters and request histogram; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.claims = {"leased": 0, "empty": 0}
        self.commits = {"accepted": 0, "rejected": 0, "invalid_output": 0}
        self.lease_expiries = 0
        # (method, route, status) -> [count per bucket (non-cumulative, +Inf last), sum]
        self._requests: dict[tuple[str, str, str], list[float]] = {}

    def count_claim(self, result: str) -> None:
        with self._lock:
            self.claims[result] += 1

    def count_commit(self, result: str) -> None:
        with self._lock:
            self.commits[result] += 1

    def count_expiries(self, n: int = 1) -> None:
        with self._lock:
            self.lease_expiries += n

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        """One request in the histogram; ``route`` must be a template (a bounded set), and a
        method outside the standard ones is labelled ``"other"``."""
        key = (method if method in _KNOWN_METHODS else OTHER_METHOD, route, str(status))
        with self._lock:
            row = self._requests.get(key)
            if row is None:
                row = self._requests[key] = [0.0] * (len(BUCKETS) + 2)
            row[bisect_left(BUCKETS, seconds)] += 1
            row[-1] += seconds

    def render(
        self, tasks: Mapping[str, int], live_leases: int, nodes: Mapping[str, int]
    ) -> str:
        """The exposition text: per-scrape gauges (given) and this process's counters."""
        out: list[str] = []

        def family(name: str, kind: str, help_text: str) -> None:
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {kind}")

        def labelled(name: str, kind: str, help_text: str, label: str, values: Mapping[str, int]) -> None:
            family(name, kind, help_text)
            out.extend(f"{name}{_labels(**{label: key})} {n}" for key, n in values.items())

        labelled("flashruntime_tasks", "gauge", "Lease tasks by state.", "state", tasks)
        family("flashruntime_live_leases", "gauge", "Leases currently held by a node.")
        out.append(f"flashruntime_live_leases {live_leases}")
        labelled("flashruntime_nodes", "gauge", "Registered nodes by status (cordoned counted besides online/offline).",
                 "status", nodes)
        with self._lock:
            claims, commits, expiries = dict(self.claims), dict(self.commits), self.lease_expiries
            requests = {key: list(row) for key, row in self._requests.items()}
        labelled("flashruntime_claims_total", "counter", "Claim requests by result.", "result", claims)
        labelled("flashruntime_commits_total", "counter", "Complete requests by result.", "result", commits)
        family("flashruntime_lease_expiries_total", "counter", "Leases lost to a missed deadline.")
        out.append(f"flashruntime_lease_expiries_total {expiries}")
        family("flashruntime_http_request_duration_seconds", "histogram", "HTTP request latency by route template.")
        for (method, route, status), row in sorted(requests.items()):
            cumulative = 0.0
            for bound, n in zip((*BUCKETS, float("inf")), row[:-1]):
                cumulative += n
                le = "+Inf" if bound == float("inf") else _number(bound)
                labels = _labels(method=method, route=route, status=status, le=le)
                out.append(f"flashruntime_http_request_duration_seconds_bucket{labels} {_number(cumulative)}")
            labels = _labels(method=method, route=route, status=status)
            out.append(f"flashruntime_http_request_duration_seconds_sum{labels} {row[-1]!r}")
            out.append(f"flashruntime_http_request_duration_seconds_count{labels} {_number(cumulative)}")
        return "\n".join(out) + "\n"
