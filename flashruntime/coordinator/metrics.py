"""``GET /metrics``: the coordinator's counters and request histogram, written in the
Prometheus text format by ``prometheus_client``.

Counters live for the process; gauges are computed per scrape by the caller and passed
to ``render``. The request histogram is keyed by the route *template*, so a path
parameter never explodes the label set. The families are built per scrape from plain
counts (a registry of our own, never the process-wide default one).
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

__all__ = ["BUCKETS", "CONTENT_TYPE", "Metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


# The methods the request histogram names; any other token a client sends (``curl -X FOO1``)
# is counted as "other", so no request can add a series of its own.
_KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE"})
OTHER_METHOD = "other"


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
        with self._lock:
            claims, commits, expiries = dict(self.claims), dict(self.commits), self.lease_expiries
            requests = {key: list(row) for key, row in self._requests.items()}

        def families() -> Iterator[Metric]:
            gauge = GaugeMetricFamily("flashruntime_tasks", "Lease tasks by state.", labels=["state"])
            for state, n in tasks.items():
                gauge.add_metric([state], n)
            yield gauge
            yield GaugeMetricFamily("flashruntime_live_leases", "Leases currently held by a node.", value=live_leases)
            gauge = GaugeMetricFamily("flashruntime_nodes",
                                      "Registered nodes by status (cordoned counted besides online/offline).",
                                      labels=["status"])
            for status, n in nodes.items():
                gauge.add_metric([status], n)
            yield gauge
            for name, help_text, label, values in (
                ("flashruntime_claims", "Claim requests by result.", "result", claims),
                ("flashruntime_commits", "Complete requests by result.", "result", commits),
            ):
                counter = CounterMetricFamily(name, help_text, labels=[label])
                for key, n in values.items():
                    counter.add_metric([key], n)
                yield counter
            yield CounterMetricFamily("flashruntime_lease_expiries", "Leases lost to a missed deadline.",
                                      value=expiries)
            histogram = HistogramMetricFamily("flashruntime_http_request_duration_seconds",
                                              "HTTP request latency by route template.",
                                              labels=["method", "route", "status"])
            for (method, route, status), row in sorted(requests.items()):
                cumulative, buckets = 0.0, []
                for bound, n in zip((*BUCKETS, float("inf")), row[:-1]):
                    cumulative += n
                    buckets.append(("+Inf" if bound == float("inf") else _bound(bound), cumulative))
                histogram.add_metric([method, route, status], buckets, row[-1])
            yield histogram

        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Families(families))
        return generate_latest(registry).decode("utf-8")


def _bound(value: float) -> str:
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class _Families:
    """A collector of the families one scrape built."""

    def __init__(self, families: Callable[[], Iterator[Metric]]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return self._families()
