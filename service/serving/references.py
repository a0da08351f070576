"""What each API process remembers of the model references it resolved
(:mod:`service.data.model_references` parses and resolves them).

Each API process remembers what an alias resolved to for ``MIXREG_ALIAS_REFRESH_S`` seconds,
so a prediction by alias costs no more database access than one by id; an alias that moves is
therefore followed by every process within that delay (plus the one lookup that refreshes it,
during which the other requests keep the previous answer). The process that moves an alias or
deletes a version forgets what it remembered of them once the change is committed, so it
follows at once. A request resolves its reference once and is answered wholly by the model it
resolved to, so no answer mixes two versions; and when that model is gone (its version deleted
right after the alias moved away from it, here, in another process or by retention), the
reference is looked up again before any 404 (:meth:`ReferenceResolver.resolve_again`), so no
prediction fails while an alias moves.
"""

from __future__ import annotations

import threading
import time

from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

from models_store.session import read_scope
from service.checks import MODEL_ID
from service.data.model_references import parse_reference, resolve_in_session


class ReferenceResolver:
    """Resolves references to model ids, remembering each for ``refresh_s`` seconds.

    A model id resolves to itself without any lookup. Thread-safe.
    """

    def __init__(self, refresh_s: float) -> None:
        self._refresh_s = refresh_s
        self._entries: dict[str, tuple[str, float]] = {}
        self._refreshing: set[str] = set()
        # Counts the forgettings: a lookup that started before one may have read what was
        # just changed, so it answers its request but is not remembered.
        self._generation = 0
        self._lock = threading.Lock()

    def cached(self, text: str) -> str | None:
        """The model id ``text`` resolved to less than ``refresh_s`` ago (or ``text`` itself if
        it is a model id); None if it must be looked up."""
        if len(text) == 32 and MODEL_ID.fullmatch(text):
            return text
        entry = self._entries.get(text)
        if entry is None:
            return None
        if entry[1] <= time.monotonic() and text not in self._refreshing:
            return None
        # Fresh, or being looked up again by one request while the others keep the last
        # answer: a burst of requests at expiry makes one database read, not one each.
        return entry[0]

    def resolve(self, text: str, session_factory: sessionmaker[Session]) -> str:
        """The model id ``text`` names, from the database unless resolved recently."""
        model_id = self.cached(text)
        if model_id is not None:
            return model_id
        return self._look_up(text, session_factory)

    def resolve_again(
        self, text: str, session_factory: sessionmaker[Session], *, missing: str
    ) -> str | None:
        """After the model ``missing`` that ``text`` resolved to was found deleted: the model
        ``text`` names now, read from the database; None if ``text`` is that model's id or
        still names it (then it is really gone: 404).

        The alias was moved away from ``missing`` before it could be deleted (a version behind
        an alias cannot be), so this finds where it points now, whatever this process
        remembered.
        """
        if MODEL_ID.fullmatch(text):
            return None
        self.forget_model(missing)
        model_id = self._look_up(text, session_factory)
        return None if model_id == missing else model_id

    def forget(self, text: str) -> None:
        """Forget what ``text`` resolved to (an alias that moved or was removed)."""
        with self._lock:
            self._generation += 1
            self._entries.pop(text, None)

    def forget_model(self, model_id: str) -> None:
        """Forget every reference that resolved to ``model_id`` (a deleted model)."""
        with self._lock:
            self._generation += 1
            for text in [text for text, (id_, _) in self._entries.items() if id_ == model_id]:
                del self._entries[text]

    def forget_after_commit(self, session: Session, text: str) -> None:
        """Forget ``text`` once ``session`` commits: forgotten earlier, a lookup between then
        and the commit would read the old state and remember it."""

        def forget(_: Session) -> None:
            self.forget(text)

        event.listen(session, "after_commit", forget, once=True)

    def _look_up(self, text: str, session_factory: sessionmaker[Session]) -> str:
        reference = parse_reference(text)
        with self._lock:
            self._refreshing.add(text)
            generation = self._generation
        try:
            # A pure read: on SQLite it takes no write lock, so it neither waits behind a
            # writer (an upload, a worker's heartbeat) nor makes one wait.
            with read_scope(session_factory) as session:
                model_id = resolve_in_session(session, reference)
            with self._lock:
                if generation == self._generation:
                    self._entries[text] = (model_id, time.monotonic() + self._refresh_s)
                    if len(self._entries) > _MAX_ENTRIES:
                        self._drop_expired()
        finally:
            with self._lock:
                self._refreshing.discard(text)
        return model_id

    def _drop_expired(self) -> None:
        now = time.monotonic()
        for key in [key for key, (_, expires) in self._entries.items() if expires <= now]:
            del self._entries[key]
        while len(self._entries) > _MAX_ENTRIES:
            self._entries.pop(next(iter(self._entries)))


_MAX_ENTRIES = 10_000
"""References remembered per process at most (a client could send endless new names)."""


def version_label(name: str | None, version: int | None) -> str | None:
    """``name/versions/N``, or None for a model that is no registered version."""
    return None if name is None or version is None else f"{name}/versions/{version}"
