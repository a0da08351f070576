"""Persistence of datasets, jobs and fitted models (SQLAlchemy 2.x; schema owned by Alembic)."""

from models_store.base import Base
from models_store.tables import Dataset, Job, Model

__all__ = ["Base", "Dataset", "Job", "Model"]
