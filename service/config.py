"""Service settings; the only module that reads the environment."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Self

from pydantic import Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import make_url

MAX_K_SWEEP_LIMIT = 1000
"""The most k values a sweep may ever list; ``MIXREG_MAX_K_SWEEP`` is at most this."""

DEFAULT_KEYED_GLOBAL_ROWS = 1_000_000
"""Rows a keyed job's global model (for unknown keys) is fitted on at most, drawn at random:
the job's process holds them besides one shard, whatever the dataset's size."""


DEFAULT_MAX_KEY_CHARS = 256
"""The longest key (characters) of a keyed fit, by default."""

DEFAULT_MAX_KEYED_COEFFICIENTS = 50_000_000
"""The most coefficients (n_keys x k x features) of a keyed fit's lines, by default: 400 MB
of float64 in each process that serves the model."""


class Settings(BaseSettings):
    """Settings read from ``MIXREG_*`` environment variables (see the README's table)."""

    model_config = SettingsConfigDict(env_prefix="MIXREG_", extra="ignore")

    database_url: str = "sqlite:///./mixreg.db"
    # A file whose content (one line) is the database password, set into database_url: the
    # password stays out of the environment and of compose files (a Docker secret).
    database_password_file: Path | None = None
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    worker: Literal["embedded", "procrastinate"] = "embedded"
    embedded_worker: bool = True
    worker_concurrency: int = Field(default=2, ge=1)
    job_time_limit_s: float = Field(default=3600.0, gt=0)
    # How long a fit process may take to start and load its dataset, before the job time limit
    # starts counting.
    load_time_limit_s: float = Field(default=600.0, gt=0)
    # Fit processes, and the processes that parse big JSON bodies, run this much nicer than the
    # server (0: the same priority): when they keep every core busy, requests are still
    # answered first.
    fit_niceness: int = Field(default=10, ge=0, le=19)
    heartbeat_interval_s: float = Field(default=1.0, gt=0)
    stale_after_s: float = Field(default=15.0, gt=0)
    # Rows a keyed job's global model (for unknown keys) is fitted on at most, drawn at random:
    # what the job's process holds besides one shard, whatever the dataset's size.
    keyed_global_rows: int = Field(default=DEFAULT_KEYED_GLOBAL_ROWS, ge=1000)
    # A keyed job's keys may hold at most this many characters, and its keys' lines at most
    # this many coefficients (n_keys x k x features): every process serving the model holds
    # them all.
    max_key_chars: int = Field(default=DEFAULT_MAX_KEY_CHARS, ge=1)
    max_keyed_coefficients: int = Field(default=DEFAULT_MAX_KEYED_COEFFICIENTS, ge=1)
    max_attempts: int = Field(default=3, ge=1)
    poll_interval_s: float = Field(default=0.2, gt=0)
    progress_interval_s: float = Field(default=0.5, ge=0)
    max_body_bytes: int = Field(default=64 * 1024 * 1024, ge=1)
    # File uploads (POST /datasets with a CSV, Parquet, NPZ or .npy body) are read in blocks.
    max_upload_bytes: int = Field(default=1024 * 1024 * 1024, ge=1)
    model_cache_size: int = Field(default=128, ge=1)
    # What the decoded models of the cache may take in memory, per process: a keyed model of
    # many keys weighs as much as thousands of plain ones.
    model_cache_bytes: int = Field(default=1024 * 1024 * 1024, ge=1)
    max_k_sweep: int = Field(default=20, ge=1, le=MAX_K_SWEEP_LIMIT)
    # "json": one JSON object per log line (for log collectors); "text" reads well in a terminal.
    log_format: Literal["text", "json"] = "text"
    # API keys (service/auth): set either to require a key on every endpoint but the probes.
    api_keys_file: Path | None = None
    api_keys: str | None = Field(default=None, repr=False)
    allow_unauthenticated: bool = False
    # Names the server answers to in the Host header, comma-separated; "*" answers any.
    allowed_hosts: str = "localhost,127.0.0.1,::1"
    # Addresses of the proxies whose X-Forwarded-Proto / X-Forwarded-For `mixreg serve` trusts
    # (comma-separated addresses or networks; "*" trusts any): behind a proxy that ends TLS,
    # the request's scheme is then https, which the sign-in's Origin check and its Secure
    # cookie follow.
    forwarded_allow_ips: str = "127.0.0.1"
    metrics_require_key: bool = True
    # How long a browser signed in to the web page (/ui/sign-in) stays signed in.
    ui_session_s: int = Field(default=8 * 3600, ge=60, le=30 * 24 * 3600)
    # What one request may ask for; more is refused with a 4xx naming the setting. A limit of
    # an algorithm parameter is at least the parameter's default, so leaving it out is never
    # refused.
    max_rows: int = Field(default=10_000_000, ge=1)
    max_features: int = Field(default=1000, ge=1)
    # An upload's rows as float64 (rows x (features + 1) x 8 bytes): what it costs to stage and
    # store, whatever its format compresses it to.
    max_decoded_bytes: int = Field(default=4 * 1024 * 1024 * 1024, ge=1)
    # The longest text (in characters) a kept column's value may be, in any format: what a
    # row's label or key needs, far below what would let a small file expand to gigabytes.
    max_text_cell_chars: int = Field(default=1024, ge=1)
    # What the arrays of a fit that grow with the square of its parameters (standard errors'
    # information matrix, a gate's Hessians) may take in the fit process: a fit needing more
    # is refused when submitted (service/jobs/fit_memory.py).
    fit_memory_bytes: int = Field(default=4 * 1024 * 1024 * 1024, ge=1)
    # The values (rows x k) one predict answer may hold, in any format.
    max_predict_values: int = Field(default=5_000_000, ge=1)
    # A JSON predict body is parsed holding the GIL, in calls no other thread interrupts (an
    # 8 MiB body held /healthz for about 0.1 s, a 31 MB one for about a second): bigger
    # batches come as .npy, .npz or binary OIP tensors.
    max_predict_json_bytes: int = Field(default=8 * 1024 * 1024, ge=1)
    max_k: int = Field(default=100, ge=1)
    max_n_partitions: int = Field(default=100_000, ge=1000)
    max_subsample_size: int = Field(default=100_000, ge=150)
    max_iterations: int = Field(default=10_000, ge=200)
    max_n_init: int = Field(default=1000, ge=1)
    max_n_bootstrap: int = Field(default=1000, ge=0)
    max_time_budget_s: float = Field(default=3000.0, gt=0)
    max_queued_jobs_per_key: int = Field(default=100, ge=1)
    model_cache_check_interval_s: float = Field(default=1.0, gt=0)
    # How long an API process keeps what `name@alias` resolved to: an alias that moves is
    # followed by every process within this delay.
    alias_refresh_s: float = Field(default=1.0, gt=0, le=3600)
    # Retention, run by the workers every retention_interval_s (service/jobs/retention.py);
    # None keeps forever.
    retention_interval_s: float = Field(default=60.0, gt=0)
    job_retention_days: float | None = Field(default=None, ge=0)
    model_retention_days: float | None = Field(default=None, ge=0)
    dataset_retention_days: float | None = Field(default=None, ge=0)
    # The prediction log (service/serving/prediction_log.py): the share of predict requests
    # logged where no model or alias has its own rate (0: off), the rows waiting to be written
    # at most (beyond, requests are not logged and counted as dropped), how often the writer
    # writes, and how long rows and outcomes are kept (None: forever), deleted in batches of
    # log_delete_batch_rows rows, each a transaction of its own.
    prediction_log_sample_rate: float = Field(default=0.0, ge=0, le=1)
    prediction_log_queue_rows: int = Field(default=100_000, ge=1)
    prediction_log_flush_interval_s: float = Field(default=0.5, gt=0, le=60)
    prediction_log_retention_days: float | None = Field(default=30.0, ge=0)
    outcome_retention_days: float | None = Field(default=365.0, ge=0)
    log_delete_batch_rows: int = Field(default=5000, ge=1)
    # Outcomes: at most this many per POST /outcomes; coverage counts an outcome whose best
    # entry is within outcome_tolerance of y (the default of GET /outcomes/metrics and of
    # /metrics).
    max_outcomes_per_request: int = Field(default=10_000, ge=1)
    outcome_tolerance: float = Field(default=1.0, gt=0)

    @model_validator(mode="after")
    def _read_database_password(self) -> Self:
        if self.database_password_file is None:
            return self
        try:
            password = self.database_password_file.read_text().strip()
        except OSError as error:
            raise ValueError(
                f"MIXREG_DATABASE_PASSWORD_FILE {self.database_password_file} cannot be read: "
                f"{error.strerror}"
            ) from error
        if not password:
            raise ValueError(
                f"MIXREG_DATABASE_PASSWORD_FILE {self.database_password_file} is empty"
            )
        url = make_url(self.database_url).set(password=password)
        self.database_url = url.render_as_string(hide_password=False)
        return self

    @model_validator(mode="after")
    def _check_worker(self) -> Self:
        if self.worker != "procrastinate":
            return self
        url = make_url(self.database_url)
        if url.get_backend_name() != "postgresql":
            raise ValueError(
                f"MIXREG_WORKER=procrastinate needs PostgreSQL (Procrastinate keeps its queue "
                f"there), but MIXREG_DATABASE_URL is {url.render_as_string(hide_password=True)}; "
                f"set a postgresql+psycopg:// URL or MIXREG_WORKER=embedded"
            )
        if self.embedded_worker and "embedded_worker" in self.model_fields_set:
            raise ValueError(
                "MIXREG_EMBEDDED_WORKER=true contradicts MIXREG_WORKER=procrastinate: with "
                "Procrastinate, fits run only in `mixreg worker` processes; unset "
                "MIXREG_EMBEDDED_WORKER"
            )
        return self

    @property
    def runs_embedded_worker(self) -> bool:
        """Whether an API process runs fits itself (its embedded worker)."""
        return self.worker == "embedded" and self.embedded_worker


class SettingsError(Exception):
    """The environment holds settings the service cannot run with; the message says which."""


def load_settings() -> Settings:
    """Read the settings from the environment; raise ``SettingsError`` naming what is wrong.

    The message names the variables and never repeats the other settings' values (the
    database URL's password among them), unlike pydantic's own error text.
    """
    try:
        return Settings()
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            message = str(error["msg"]).removeprefix("Value error, ")
            if error["loc"]:
                variable = "MIXREG_" + "_".join(str(part) for part in error["loc"]).upper()
                message = f"{variable}: {message}"
            problems.append(message)
        raise SettingsError("; ".join(problems)) from None
