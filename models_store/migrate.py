"""Run the Alembic migrations programmatically, from any working directory."""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from models_store import downgrade_losses as data_loss
from models_store.session import make_engine

# Tables created by migrations as foreign SQL (Procrastinate's queue, revision 0003) rather than
# described by our models; autogenerate must not propose to drop them.
FOREIGN_TABLE_PREFIXES = ("procrastinate_",)

# Key of the PostgreSQL advisory lock that serializes concurrent upgrades (several API
# processes starting at once, or an API beside the one-shot migration).
MIGRATION_LOCK_KEY = 0x6D69787265670001


def include_name(name: str | None, type_: str, parent_names: Mapping[str, str | None]) -> bool:
    """Alembic's autogenerate filter: compare our tables, never the foreign ones."""
    if type_ == "table" and name is not None:
        return not name.startswith(FOREIGN_TABLE_PREFIXES)
    return True


def _config(url: str | None = None) -> Config:
    config = Config()
    # The migrations ship as a package next to this one, so they are found wherever it is
    # installed, whatever the current directory.
    config.set_main_option("script_location", str(resources.files("migrations")))
    if url is not None:
        # ConfigParser interpolates '%'; URL-encoded passwords contain it.
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    """Upgrade the database at ``url`` to ``revision``."""
    command.upgrade(_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    """Downgrade the database at ``url`` to ``revision`` (by default: drop every table)."""
    command.downgrade(_config(url), revision)


def downgrade_losses(url: str, revision: str) -> list[str]:
    """What downgrading the database at ``url`` to ``revision`` would delete or drop, one
    line per kind with its count (empty: nothing is lost)."""
    script = ScriptDirectory.from_config(_config())
    return data_loss.downgrade_losses(url, script, current_revision(url), revision)


def current_revision(url: str) -> str | None:
    """Return the revision the database at ``url`` is at, or None if it was never migrated."""
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()


def head_revision() -> str | None:
    """Return the newest revision the migrations define."""
    return ScriptDirectory.from_config(_config()).get_current_head()
