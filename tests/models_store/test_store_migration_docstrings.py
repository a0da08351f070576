"""Each migration's docstring names the revision it revises, as its ``down_revision`` does."""

from __future__ import annotations

import re

from alembic.script import ScriptDirectory

from models_store import migrate


def test_each_migration_docstring_names_its_down_revision():
    scripts = ScriptDirectory.from_config(migrate._config())
    wrong = []
    for script in scripts.walk_revisions():
        documented = re.search(r"^Revises: *(\S*)$", script.module.__doc__ or "", re.MULTILINE)
        said = documented.group(1) if documented else "(nothing)"
        if said != (script.down_revision or ""):
            wrong.append((script.revision, said, script.down_revision))
    assert wrong == [], "revision, docstring's 'Revises:', down_revision"
