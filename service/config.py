"""Service settings; the only module that reads the environment."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

MAX_K_SWEEP_LIMIT = 1000
"""The most k values a sweep may ever list; ``MIXREG_MAX_K_SWEEP`` is at most this."""


class Settings(BaseSettings):
    """Settings read from ``MIXREG_*`` environment variables (see the README's table)."""

    model_config = SettingsConfigDict(env_prefix="MIXREG_", extra="ignore")

    database_url: str = "sqlite:///./mixreg.db"
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    embedded_worker: bool = True
    worker_concurrency: int = Field(default=2, ge=1)
    job_time_limit_s: float = Field(default=3600.0, gt=0)
    heartbeat_interval_s: float = Field(default=1.0, gt=0)
    stale_after_s: float = Field(default=15.0, gt=0)
    max_attempts: int = Field(default=3, ge=1)
    poll_interval_s: float = Field(default=0.2, gt=0)
    progress_interval_s: float = Field(default=0.5, ge=0)
    max_body_bytes: int = Field(default=64 * 1024 * 1024, ge=1)
    model_cache_size: int = Field(default=128, ge=1)
    max_k_sweep: int = Field(default=20, ge=1, le=MAX_K_SWEEP_LIMIT)
