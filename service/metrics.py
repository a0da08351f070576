"""Prometheus metrics of one app: requests by route, jobs by status, fit durations, the
prediction log's rows and the outcomes of logged predictions."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
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


class _PredictionLog(Collector):
    """The prediction log's row counts of this process, read at scrape time (the hot path
    only adds to plain integers)."""

    def __init__(self, read_counts: Callable[[], dict[str, float]]) -> None:
        self._read_counts = read_counts

    def collect(self) -> Iterator[Metric]:
        counts = self._read_counts()
        yield CounterMetricFamily(
            "mixreg_prediction_log_writer_cpu_seconds",
            "CPU time this process's log writer spent computing and writing sampled rows",
            value=counts["writer_cpu_seconds"],
        )
        rows = CounterMetricFamily(
            "mixreg_prediction_log_rows",
            "Predicted rows sampled for the log by this process, and what became of them: "
            "written, dropped (the queue was full) or failed (the write failed)",
            labels=["state"],
        )
        for state in ("sampled", "written", "dropped", "failed"):
            rows.add_metric([state], counts[f"{state}_rows"])
        yield rows
        yield GaugeMetricFamily(
            "mixreg_prediction_log_queued_rows",
            "Sampled rows waiting to be written by this process",
            value=counts["queued_rows"],
        )


OUTCOME_LABELS = ["model_id", "registered_model", "version", "alias"]


class _Outcomes(Collector):
    """Outcome metrics per model version and alias, read from the shared tables at scrape
    time, so every process reports the same."""

    def __init__(self, read_outcomes: Callable[[], list[dict[str, Any]]]) -> None:
        self._read_outcomes = read_outcomes

    def collect(self) -> Iterator[Metric]:
        families = {
            "count": GaugeMetricFamily(
                "mixreg_outcomes_24h",
                "Outcomes of the predictions of the last 24 hours",
                labels=OUTCOME_LABELS,
            ),
            "min_loss": GaugeMetricFamily(
                "mixreg_outcome_min_loss_24h",
                "Mean over those outcomes of min_j (y - prediction_j)^2",
                labels=OUTCOME_LABELS,
            ),
            "coverage": GaugeMetricFamily(
                "mixreg_outcome_coverage_24h",
                "Share of those outcomes whose best entry is within MIXREG_OUTCOME_TOLERANCE",
                labels=OUTCOME_LABELS,
            ),
        }
        for group in self._read_outcomes():
            labels = [group[name] for name in OUTCOME_LABELS]
            for field, family in families.items():
                family.add_metric(labels, group[field])
        yield from families.values()


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

    def report_prediction_log_with(self, read_counts: Callable[[], dict[str, float]]) -> None:
        """Report the prediction log's row counts using ``read_counts`` at every scrape."""
        self.registry.register(_PredictionLog(read_counts))

    def report_outcomes_with(self, read_outcomes: Callable[[], list[dict[str, Any]]]) -> None:
        """Report outcome metrics per model using ``read_outcomes`` at every scrape."""
        self.registry.register(_Outcomes(read_outcomes))

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
