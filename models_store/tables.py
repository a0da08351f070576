"""The mapped tables: datasets, jobs and fitted models."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    Double,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from models_store.base import Base

ID_LENGTH = 32
"""Length of the uuid4 hex strings used as primary keys."""

REGISTERED_NAME_LENGTH = 128
"""The most characters of a registered model's name or of an alias."""

JOB_STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")
TERMINAL_JOB_STATUSES = ("succeeded", "failed", "cancelled")

IDEMPOTENCY_SCOPE_WITHOUT_KEY = ""
"""The one scope of the Idempotency-Keys of callers without an API key."""


class Dataset(Base):
    """An uploaded design matrix and target: its shape and names (values in ``DatasetChunk``)."""

    __tablename__ = "datasets"
    __table_args__ = (
        UniqueConstraint(
            "idempotency_scope", "idempotency_key", name="uq_datasets_idempotency_scope_key"
        ),
        # Revision 0013: lists are newest first, a page read from the index, not a sort.
        Index("ix_datasets_created_at_id", "created_at", "id"),
    )

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    name: Mapped[str | None] = mapped_column(String)
    n_rows: Mapped[int]
    n_features: Mapped[int]
    feature_names: Mapped[list[str]] = mapped_column(JSON)
    target_name: Mapped[str | None] = mapped_column(String)
    created_at: Mapped[datetime]
    # Added in revision 0005: an upload retried with the same Idempotency-Key finds its dataset.
    idempotency_key: Mapped[str | None] = mapped_column(String)
    request_hash: Mapped[str | None] = mapped_column(String(128))
    # Added in revision 0006: the caller (API key id; IDEMPOTENCY_SCOPE_WITHOUT_KEY without
    # one) within which idempotency_key is unique.
    idempotency_scope: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    # Added in revision 0008: the columns kept beside the features and the target, each
    # ``{"name": ..., "type": "number" | "string"}`` (values in ``DatasetChunk.extra_data``).
    extra_columns: Mapped[list[dict[str, str]]] = mapped_column(JSON, default=list)


class DatasetChunk(Base):
    """A block of consecutive rows of a dataset as raw float64 bytes (revision 0004).

    The dataset's rows are its chunks' rows in ``position`` order; ``x_data`` holds
    ``n_rows * n_features`` little-endian float64 values in C order, ``y_data`` ``n_rows``;
    ``extra_data`` (revision 0008) the chunk's extra columns as one Arrow IPC stream, None for a
    dataset without extra columns.
    """

    __tablename__ = "dataset_chunks"

    dataset_id: Mapped[str] = mapped_column(
        String(ID_LENGTH), ForeignKey("datasets.id", ondelete="CASCADE"), primary_key=True
    )
    position: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    n_rows: Mapped[int]
    x_data: Mapped[bytes] = mapped_column(LargeBinary)
    y_data: Mapped[bytes] = mapped_column(LargeBinary)
    extra_data: Mapped[bytes | None] = mapped_column(LargeBinary)


class Job(Base):
    """A fit request and its state, progress, attempts and outcome."""

    __tablename__ = "jobs"
    __table_args__ = (
        CheckConstraint(
            "status IN ({})".format(", ".join(f"'{status}'" for status in JOB_STATUSES)),
            name="status",
        ),
        UniqueConstraint(
            "idempotency_scope", "idempotency_key", name="uq_jobs_idempotency_scope_key"
        ),
        Index("ix_jobs_created_at_id", "created_at", "id"),
    )

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    status: Mapped[str] = mapped_column(String(16), index=True)
    # No foreign key since revision 0007: a dataset may be deleted once no unfinished job uses
    # it, and the job keeps the (then dangling) id as provenance.
    dataset_id: Mapped[str] = mapped_column(String(ID_LENGTH), index=True)
    name: Mapped[str | None] = mapped_column(String)
    algorithm: Mapped[str] = mapped_column(String(64))
    # For a k sweep, the largest k; ``k_values`` lists every k (None for a single k).
    n_components: Mapped[int]
    k_values: Mapped[list[int] | None] = mapped_column(JSON)
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    fit_intercept: Mapped[bool]
    holdout_fraction: Mapped[float] = mapped_column(Double)
    seed: Mapped[int | None] = mapped_column(BigInteger)
    time_budget_s: Mapped[float | None] = mapped_column(Double)
    idempotency_key: Mapped[str | None] = mapped_column(String)
    request_hash: Mapped[str | None] = mapped_column(String(128))
    # Added in revision 0006: see Dataset.idempotency_scope.
    idempotency_scope: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    attempts: Mapped[int] = mapped_column(default=0)
    max_attempts: Mapped[int]
    cancel_requested: Mapped[bool] = mapped_column(default=False)
    progress_fraction: Mapped[float] = mapped_column(Double, default=0.0)
    progress_iteration: Mapped[int | None]
    progress_candidates: Mapped[int | None]
    progress_best_loss: Mapped[float | None] = mapped_column(Double)
    progress_n_components: Mapped[int | None]
    error: Mapped[str | None] = mapped_column(Text)
    worker_id: Mapped[str | None] = mapped_column(String)
    heartbeat_at: Mapped[datetime | None]
    created_at: Mapped[datetime]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    # No foreign key: a model may be deleted while its job record stays.
    model_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    # A k sweep's result: the preferred k and, per k, its model and scores.
    sweep: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Added in revision 0009: the dataset columns of the row weights and of the group labels.
    weights_column: Mapped[str | None] = mapped_column(String)
    groups_column: Mapped[str | None] = mapped_column(String)
    warnings: Mapped[list[str]] = mapped_column(JSON, default=list)
    # Added in revision 0003: the Procrastinate job that carries this job (None when the
    # embedded worker runs it).
    task_id: Mapped[int | None] = mapped_column(BigInteger)
    # Added in revision 0005: the id of the API key that submitted the job (None without keys).
    api_key_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    # Added in revision 0007: the registered model whose next version the fit becomes.
    registered_model: Mapped[str | None] = mapped_column(String(REGISTERED_NAME_LENGTH))
    # Added in revision 0007: delete the job's dataset once it is finished (None: keep it).
    discard_data: Mapped[bool | None]
    # Added in revision 0011: the standard errors and bootstrap asked for (None: jobs stored
    # before, which computed none).
    uncertainty: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Added in revision 0010: None (no gate), "features", or the extra columns the gate reads.
    gating: Mapped[str | list[str] | None] = mapped_column(JSON)
    # Added in revision 0012: a keyed fit (one mixture per value of this dataset column), what
    # keys with too few rows get ("k1" or "skip"), and its progress counted in keys.
    split_by: Mapped[str | None] = mapped_column(String)
    small_keys: Mapped[str | None] = mapped_column(String(8))
    keys_done: Mapped[int | None]
    n_keys: Mapped[int | None]
    keyed_summary: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    keys_per_shard: Mapped[int | None]


class Model(Base):
    """A fitted mixture: the k lines as plain JSON numbers, with metrics and provenance."""

    __tablename__ = "models"
    __table_args__ = (Index("ix_models_created_at_id", "created_at", "id"),)

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    job_id: Mapped[str | None] = mapped_column(
        String(ID_LENGTH), ForeignKey("jobs.id", ondelete="SET NULL")
    )
    # No foreign key since revision 0007 (see ``Job.dataset_id``).
    dataset_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    name: Mapped[str | None] = mapped_column(String)
    algorithm: Mapped[str] = mapped_column(String(64))
    n_components: Mapped[int]
    n_features: Mapped[int]
    feature_names: Mapped[list[str]] = mapped_column(JSON)
    fit_intercept: Mapped[bool]
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    seed: Mapped[int | None] = mapped_column(BigInteger)
    coef: Mapped[list[list[float]]] = mapped_column(JSON)
    intercept: Mapped[list[float]] = mapped_column(JSON)
    shares: Mapped[list[float]] = mapped_column(JSON)
    train_min_loss: Mapped[float] = mapped_column(Double)
    holdout_min_loss: Mapped[float | None] = mapped_column(Double)
    baseline: Mapped[dict[str, Any]] = mapped_column(JSON)
    n_train: Mapped[int]
    n_holdout: Mapped[int]
    loss_history: Mapped[list[float]] = mapped_column(JSON)
    n_iter: Mapped[int]
    fit_seconds: Mapped[float] = mapped_column(Double)
    created_at: Mapped[datetime]
    # Added in revision 0002: None for models stored before (their warnings are empty).
    converged: Mapped[bool | None]
    log_likelihood: Mapped[float | None] = mapped_column(Double)
    bic: Mapped[float | None] = mapped_column(Double)
    n_parameters: Mapped[int | None]
    # Added in revision 0010: the fitted gate of a gated mixture (None without one).
    gate: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    candidates: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    warnings: Mapped[list[str]] = mapped_column(JSON, default=list)
    # Added in revision 0009: the dataset columns of the row weights and the group labels, and
    # for a grouped fit its group -> line table (codecs.encode_group_table) and group metrics.
    weights_column: Mapped[str | None] = mapped_column(String)
    groups_column: Mapped[str | None] = mapped_column(String)
    group_table: Mapped[bytes | None] = mapped_column(LargeBinary, deferred=True)
    group_metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Added in revision 0011: per line, the estimates with standard errors, z, p and
    # intervals (None: computed for no fit stored before, nor when not asked for).
    uncertainty: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Added in revision 0012: a keyed model's key column and its per-key counts, failures and
    # min-loss quantiles; its lines are in ``KeyedModelChunk`` (the model's own lines above are
    # the global model, for keys it does not know).
    split_by: Mapped[str | None] = mapped_column(String)
    keyed_summary: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class KeyedModelChunk(Base):
    """Consecutive keys of a keyed model (in key order) and their lines (revision 0012).

    ``data`` is an ``.npz`` archive (read without pickle) of the arrays ``keys`` (int64; text
    keys as ``keys.utf8`` and ``keys.offsets``, ``codecs.encode_arrays``, or fixed-width
    unicode in chunks stored before), ``coef`` (n_keys, k, d), ``intercept`` and ``shares``
    (n_keys, k), ``min_loss``, ``n_rows`` and ``status`` (n_keys,).
    """

    __tablename__ = "keyed_model_chunks"

    model_id: Mapped[str] = mapped_column(
        String(ID_LENGTH), ForeignKey("models.id", ondelete="CASCADE"), primary_key=True
    )
    position: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    n_keys: Mapped[int]
    # The attempt of the job that fitted these keys (None: stored at once by the model's job).
    fitted_attempt: Mapped[int | None]
    # The worker that fitted these keys (revision 0016; None before it).
    fitted_by: Mapped[str | None] = mapped_column(String)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class KeyedJobShard(Base):
    """A shard of consecutive keys that a running keyed job has fitted (revision 0012): kept
    until the job stores its model, so that an attempt after a lost worker fits only the
    shards not stored yet. ``data`` as ``KeyedModelChunk.data``."""

    __tablename__ = "keyed_job_shards"

    job_id: Mapped[str] = mapped_column(
        String(ID_LENGTH), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    position: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    n_keys: Mapped[int]
    fitted_attempt: Mapped[int]
    # The worker that fitted the shard (revision 0016).
    fitted_by: Mapped[str | None] = mapped_column(String)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class KeyedJobShardClaim(Base):
    """A shard of a keyed job's plan and who fits it (revision 0016): any worker may claim a
    shard that is not ``done`` and not claimed, or whose claimant's ``heartbeat_at`` is older
    than the stale limit (a claimant that died), so several workers fit one job's shards.
    ``rows`` are the dataset rows of the shard's keys, ``.npz`` (``rows``, or ``starts`` and
    ``lengths`` of runs of consecutive rows), so a claimant reads only the chunks that hold
    them."""

    __tablename__ = "keyed_job_shard_claims"

    job_id: Mapped[str] = mapped_column(
        String(ID_LENGTH), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    position: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    n_keys: Mapped[int]
    n_rows: Mapped[int]
    rows: Mapped[bytes] = mapped_column(LargeBinary)
    claimed_by: Mapped[str | None] = mapped_column(String)
    heartbeat_at: Mapped[datetime | None]
    # Keys its claimant has fitted so far (the job's progress counts them).
    keys_done: Mapped[int] = mapped_column(default=0)
    done: Mapped[bool] = mapped_column(default=False)


class RegisteredModel(Base):
    """A name under which successive fits become versions 1, 2, 3, ... (revision 0007)."""

    __tablename__ = "registered_models"

    name: Mapped[str] = mapped_column(String(REGISTERED_NAME_LENGTH), primary_key=True)
    # The highest version ever given; versions are never reused, even after a deletion.
    latest_version: Mapped[int] = mapped_column(default=0)
    created_at: Mapped[datetime]


class ModelVersion(Base):
    """Version ``version`` of a registered model: one fitted model (revision 0007)."""

    __tablename__ = "model_versions"

    registered_model: Mapped[str] = mapped_column(
        String(REGISTERED_NAME_LENGTH),
        ForeignKey("registered_models.name", ondelete="CASCADE"),
        primary_key=True,
    )
    version: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    model_id: Mapped[str] = mapped_column(
        String(ID_LENGTH), ForeignKey("models.id", ondelete="CASCADE"), unique=True
    )
    created_at: Mapped[datetime]


class ModelAlias(Base):
    """A movable name (``production``, ``staging``, ...) for one version (revision 0007)."""

    __tablename__ = "model_aliases"
    __table_args__ = (
        # A version behind an alias cannot be deleted: the alias must move first.
        ForeignKeyConstraint(
            ["registered_model", "version"],
            ["model_versions.registered_model", "model_versions.version"],
            name="fk_model_aliases_version_model_versions",
        ),
    )

    registered_model: Mapped[str] = mapped_column(
        String(REGISTERED_NAME_LENGTH),
        ForeignKey("registered_models.name", ondelete="CASCADE"),
        primary_key=True,
    )
    alias: Mapped[str] = mapped_column(String(REGISTERED_NAME_LENGTH), primary_key=True)
    version: Mapped[int]
    updated_at: Mapped[datetime]
    updated_by: Mapped[str | None] = mapped_column(String(ID_LENGTH))


class ModelAliasEvent(Base):
    """One move of an alias: who (which API key), when, from which version to which."""

    __tablename__ = "model_alias_events"
    __table_args__ = (Index("ix_model_alias_events_registered_model", "registered_model", "id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    registered_model: Mapped[str] = mapped_column(String(REGISTERED_NAME_LENGTH))
    alias: Mapped[str] = mapped_column(String(REGISTERED_NAME_LENGTH))
    # None: the alias was created (from) or removed (to).
    from_version: Mapped[int | None]
    to_version: Mapped[int | None]
    changed_by: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    changed_at: Mapped[datetime]


REQUEST_ID_LENGTH = 128
"""The longest request id (``X-Request-ID``) a prediction is logged under."""


class PredictionLogSetting(Base):
    """The share of predictions logged for one model id or one ``name@alias`` (revision 0032);
    a target without a row takes ``MIXREG_PREDICTION_LOG_SAMPLE_RATE``."""

    __tablename__ = "prediction_log_settings"

    target: Mapped[str] = mapped_column(String(2 * REGISTERED_NAME_LENGTH + 1), primary_key=True)
    sample_rate: Mapped[float] = mapped_column(Double)
    updated_at: Mapped[datetime]
    updated_by: Mapped[str | None] = mapped_column(String(ID_LENGTH))


class LoggedPrediction(Base):
    """One row of a sampled predict request: what was asked and the k values answered
    (revision 0032). No foreign key to the model: the log outlives a deleted model."""

    __tablename__ = "prediction_log"
    __table_args__ = (
        # A caller choosing its own X-Request-ID could repeat one: the first is kept.
        UniqueConstraint("request_id", "row_index", name="uq_prediction_log_request_id_row"),
        # Retention deletes the oldest rows first, in batches read from this index.
        Index("ix_prediction_log_logged_at", "logged_at", "id"),
    )

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer(), "sqlite"), primary_key=True
    )
    request_id: Mapped[str] = mapped_column(String(REQUEST_ID_LENGTH))
    row_index: Mapped[int]
    logged_at: Mapped[datetime]
    model_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    registered_model: Mapped[str | None] = mapped_column(String(REGISTERED_NAME_LENGTH))
    version: Mapped[int | None]
    # The alias the request named (``production`` of ``recommender@production``), if any.
    alias: Mapped[str | None] = mapped_column(String(REGISTERED_NAME_LENGTH))
    # A keyed prediction's key, as text (an integer key in decimal).
    key: Mapped[str | None] = mapped_column(Text)
    # The row's features and its k predictions as little-endian float64 bytes: written
    # without a JSON encoding per row (the log's writer shares the API process's CPU).
    features: Mapped[bytes] = mapped_column(LargeBinary)
    predictions: Mapped[bytes] = mapped_column(LargeBinary)
    # A gated model's most likely line for the row.
    most_likely_component: Mapped[int | None]


class PredictionOutcome(Base):
    """A realised target joined to its logged prediction, with the errors it gives
    (revision 0032). The model, version, alias and key are copied from the log so that the
    metrics outlive the log's retention."""

    __tablename__ = "prediction_outcomes"
    __table_args__ = (
        UniqueConstraint("request_id", "row_index", name="uq_prediction_outcomes_request_id_row"),
        # Metrics read one model's (or registered model's) outcomes over a span of hours.
        Index("ix_prediction_outcomes_model_id_hour", "model_id", "predicted_hour"),
        Index("ix_prediction_outcomes_registered_model_hour", "registered_model", "predicted_hour"),
        Index("ix_prediction_outcomes_observed_at", "observed_at", "id"),
    )

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer(), "sqlite"), primary_key=True
    )
    request_id: Mapped[str] = mapped_column(String(REQUEST_ID_LENGTH))
    row_index: Mapped[int]
    model_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    registered_model: Mapped[str | None] = mapped_column(String(REGISTERED_NAME_LENGTH))
    version: Mapped[int | None]
    alias: Mapped[str | None] = mapped_column(String(REGISTERED_NAME_LENGTH))
    key: Mapped[str | None] = mapped_column(Text)
    predicted_at: Mapped[datetime]
    # Whole hours since the Unix epoch of predicted_at: windows of hours and days are
    # integer divisions of it, the same SQL on SQLite and PostgreSQL.
    predicted_hour: Mapped[int]
    observed_at: Mapped[datetime]
    y: Mapped[float] = mapped_column(Double)
    # min over the k lines of (y - prediction)^2, and the line that reaches it.
    min_loss: Mapped[float] = mapped_column(Double)
    best_component: Mapped[int]
    # The model's k: the length of the list the prediction was.
    n_components: Mapped[int]
    # A gated model's most likely line's squared error (None for other models).
    most_likely_loss: Mapped[float | None] = mapped_column(Double)
