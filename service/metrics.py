"""Prometheus metrics of one app: requests by route, jobs by status, fit durations."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from models_store.tables import JOB_STATUSES

FIT_SECONDS_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900, 3600)


class _JobsByStatus(Collector):
    """Counts jobs per status at scrape time, so every process reports the shared table."""

    def __init__(self, count_jobs: Callable[[], dict[str, int]]) -> None:
        self._count_jobs = count_jobs

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            "mixreg_jobs", "Jobs in the database by status", labels=["status"]
        )
        counts = self._count_jobs()
        for status in JOB_STATUSES:
            gauge.add_metric([status], counts.get(status, 0))
        yield gauge


class ServiceMetrics:
    """The metrics of one app, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "mixreg_http_requests",
            "HTTP requests by method, route template and status code",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "mixreg_http_request_duration_seconds",
            "HTTP request latency by method and route template",
            ["method", "route"],
            registry=self.registry,
        )
        self.fit_seconds = Histogram(
            "mixreg_fit_duration_seconds",
            "Wall time of fits run by this process's embedded worker, by algorithm and outcome",
            ["algorithm", "status"],
            buckets=FIT_SECONDS_BUCKETS,
            registry=self.registry,
        )

    def count_jobs_with(self, count_jobs: Callable[[], dict[str, int]]) -> None:
        """Report jobs by status using ``count_jobs`` at every scrape."""
        self.registry.register(_JobsByStatus(count_jobs))

    def observe_request(self, *, method: str, route: str, status: int, seconds: float) -> None:
        """Record one served request."""
        self.requests.labels(method, route, str(status)).inc()
        self.latency.labels(method, route).observe(seconds)

    def observe_fit(self, *, algorithm: str, status: str, seconds: float) -> None:
        """Record one fit that ended."""
        self.fit_seconds.labels(algorithm, status).observe(seconds)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
