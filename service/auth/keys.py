"""API keys: their format, their hashes, and where they are kept.

A key reads ``mixreg_<id>_<secret>``: the 12 hex digits of its id are public (they name the
key in logs, listings and errors), the 43 characters of its secret carry 256 random bits. Only
a SHA-256 hash of the whole key is stored — in the JSON file named by ``MIXREG_API_KEYS_FILE``
(written by ``mixreg keys``) or in ``MIXREG_API_KEYS`` entries ``<id>:<scope>:sha256:<hex>``.
A fast hash suffices because the secret is random, not chosen by a person: no dictionary
attack applies, and a slow hash would cost every request (docs/adr: API keys).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import logging
import os
import re
import secrets
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

logger = logging.getLogger(__name__)

Scope = Literal["read", "write"]
SCOPES: tuple[Scope, ...] = ("read", "write")

KEY_PREFIX = "mixreg_"
_ID_HEX_DIGITS = 12
_SECRET_BYTES = 32  # token_urlsafe(32) has 43 characters
_KEY_PATTERN = re.compile(r"mixreg_([0-9a-f]{12})_([A-Za-z0-9_-]{43})")
_ID_PATTERN = re.compile(r"[0-9a-f]{12}")
_HASH_PATTERN = re.compile(r"sha256:[0-9a-f]{64}")
MAX_KEY_LENGTH = 256
"""Longer ``Authorization`` credentials are refused without hashing them."""
MAX_NAME_LENGTH = 200
"""The most characters of a key's name (a note saying whose it is)."""


class KeyStoreError(Exception):
    """A key file or ``MIXREG_API_KEYS`` cannot be read or changed; the message says why."""


@dataclass(frozen=True)
class ApiKey:
    """A stored API key: its public id, scope and hash (never the key itself)."""

    id: str
    scope: Scope
    key_hash: str
    name: str | None = None
    created_at: datetime | None = None
    revoked_at: datetime | None = None
    source: Literal["file", "environment"] = "file"

    def grants(self, needed: Scope) -> bool:
        """Whether this key may call an endpoint that needs ``needed`` (write includes read)."""
        return needed == "read" or self.scope == "write"

    @property
    def revoked(self) -> bool:
        """True once the key was revoked."""
        return self.revoked_at is not None


@dataclass(frozen=True)
class NewKey:
    """A freshly made key: ``key`` is shown to its owner once, ``record`` is what is kept."""

    key: str
    record: ApiKey


def hash_key(key: str) -> str:
    """The stored form of ``key``: ``sha256:<64 hex digits>``."""
    return "sha256:" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def key_id(key: str) -> str | None:
    """The public id of a well-formed key, else None."""
    match = _KEY_PATTERN.fullmatch(key)
    return match.group(1) if match else None


def looks_like_key(text: str) -> bool:
    """True if ``text`` contains something of the form of a key (to refuse it in URLs)."""
    return _KEY_PATTERN.search(text) is not None


def new_key(*, scope: Scope, name: str | None = None, now: datetime | None = None) -> NewKey:
    """A new random key of ``scope``."""
    identifier = secrets.token_hex(_ID_HEX_DIGITS // 2)
    key = f"{KEY_PREFIX}{identifier}_{secrets.token_urlsafe(_SECRET_BYTES)}"
    record = ApiKey(
        id=identifier,
        scope=scope,
        key_hash=hash_key(key),
        name=name,
        created_at=now or datetime.now(UTC),
    )
    return NewKey(key=key, record=record)


def keys_match(presented: str, stored_hash: str) -> bool:
    """Whether ``presented`` hashes to ``stored_hash``, in time independent of where they differ."""
    return hmac.compare_digest(hash_key(presented).encode(), stored_hash.encode())


# --- MIXREG_API_KEYS: "<id>:<scope>:sha256:<hex>" entries separated by commas or whitespace ---


def environment_entry(record: ApiKey) -> str:
    """The ``MIXREG_API_KEYS`` entry of ``record``."""
    return f"{record.id}:{record.scope}:{record.key_hash}"


def parse_environment_entries(text: str) -> list[ApiKey]:
    """The keys listed in ``MIXREG_API_KEYS``; raise ``KeyStoreError`` naming a bad entry."""
    records: list[ApiKey] = []
    for index, entry in enumerate(re.split(r"[\s,]+", text.strip())):
        if not entry:
            continue
        parts = entry.split(":", 2)
        if (
            len(parts) != 3
            or not _ID_PATTERN.fullmatch(parts[0])
            or parts[1] not in SCOPES
            or not _HASH_PATTERN.fullmatch(parts[2])
        ):
            raise KeyStoreError(
                f"MIXREG_API_KEYS entry {index + 1} is not of the form <id>:<read|write>:"
                f"sha256:<64 hex digits> (as printed by `mixreg keys create --env`)"
            )
        scope: Scope = "read" if parts[1] == "read" else "write"
        records.append(ApiKey(id=parts[0], scope=scope, key_hash=parts[2], source="environment"))
    _check_unique(records, where="MIXREG_API_KEYS")
    return records


def _check_unique(records: list[ApiKey], *, where: str) -> None:
    seen: set[str] = set()
    for record in records:
        if record.id in seen:
            raise KeyStoreError(f"{where} lists the key id {record.id} twice")
        seen.add(record.id)


# --- the key file (MIXREG_API_KEYS_FILE) ---


class _StoredKey(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=_ID_PATTERN.pattern)
    scope: Scope
    hash: str = Field(pattern=_HASH_PATTERN.pattern)
    name: str | None = Field(default=None, max_length=MAX_NAME_LENGTH)
    created_at: datetime | None = None
    revoked_at: datetime | None = None


class _KeyFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: Literal["mixreg-api-keys"] = "mixreg-api-keys"
    version: Literal[1] = 1
    keys: list[_StoredKey] = Field(default_factory=list)


def read_key_file(path: Path) -> list[ApiKey]:
    """The keys kept in ``path``; a missing file holds none."""
    try:
        content = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise KeyStoreError(f"cannot read the API key file {path}: {exc.strerror}") from None
    try:
        stored = _KeyFile.model_validate_json(content)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the file"
        raise KeyStoreError(
            f"the API key file {path} is not a mixreg key file ({where}: {first['msg']})"
        ) from None
    records = [
        ApiKey(
            id=item.id,
            scope=item.scope,
            key_hash=item.hash,
            name=item.name,
            created_at=item.created_at,
            revoked_at=item.revoked_at,
        )
        for item in stored.keys
    ]
    _check_unique(records, where=f"the API key file {path}")
    return records


def _write_key_file(path: Path, records: list[ApiKey]) -> None:
    """Replace ``path`` atomically by a file of ``records`` that only its owner can read."""
    document = _KeyFile(
        keys=[
            _StoredKey(
                id=record.id,
                scope=record.scope,
                hash=record.key_hash,
                name=record.name,
                created_at=record.created_at,
                revoked_at=record.revoked_at,
            )
            for record in records
        ]
    )
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as stream:
            stream.write(document.model_dump_json(indent=2) + "\n")
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, 0o600)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock beside ``path``, so concurrent ``mixreg keys`` runs take turns."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise KeyStoreError(f"cannot lock the API key file {path}: {exc.strerror}") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
    finally:
        os.close(lock)


def add_key(path: Path, record: ApiKey) -> None:
    """Append ``record`` to the key file ``path`` (created if missing)."""
    with _locked(path):
        records = read_key_file(path)
        records.append(record)
        _check_unique(records, where=f"the API key file {path}")
        _write_key_file(path, records)


def revoke_key(path: Path, identifier: str, *, now: datetime | None = None) -> ApiKey:
    """Mark the key ``identifier`` of ``path`` revoked (it stays listed); return it."""
    with _locked(path):
        records = read_key_file(path)
        for index, record in enumerate(records):
            if record.id == identifier:
                if record.revoked_at is None:
                    record = replace(record, revoked_at=now or datetime.now(UTC))
                    records[index] = record
                    _write_key_file(path, records)
                return record
    raise KeyStoreError(f"the API key file {path} has no key {identifier}")


# --- the server's view of the keys ---


class InvalidKeyError(Exception):
    """The presented credential is not a known key."""


class RevokedKeyError(Exception):
    """The presented key is known but was revoked."""

    def __init__(self, record: ApiKey) -> None:
        super().__init__(record.id)
        self.record = record


MAX_VERIFIED_KEYS = 1024
"""How many verified keys a key ring remembers (it starts over when full)."""

# Compared against when the presented id is unknown, so that path takes as long as a mismatch.
_UNKNOWN_KEY_HASH = hash_key("unknown")


class KeyRing:
    """The keys a server accepts: ``MIXREG_API_KEYS`` entries and the key file.

    The file is read again whenever it changes (a ``stat`` per lookup), so keys created or
    revoked with ``mixreg keys`` take effect at once, in every process that reads the file.
    """

    def __init__(self, *, file: Path | None, environment: str | None) -> None:
        self.file = file
        self.enabled = file is not None or environment is not None
        self._environment = parse_environment_entries(environment or "")
        self._file_keys: list[ApiKey] = []
        self._file_state: tuple[int, int, int] | None = None
        self._by_id: dict[str, ApiKey] = {}
        # Keys presented and verified since the keys were last read -> their records: a key
        # sent again costs a dict lookup, not a hash. Emptied whenever the keys are read again
        # (a revocation included).
        self._verified: dict[str, ApiKey] = {}
        self._loaded = False
        self._refresh(strict=True)

    @property
    def keys(self) -> list[ApiKey]:
        """Every key, revoked ones included."""
        self._refresh(strict=False)
        return list(self._by_id.values())

    def _refresh(self, *, strict: bool) -> None:
        if self.file is None:
            state = None
        else:
            try:
                stat = self.file.stat()
                state = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
            except FileNotFoundError:
                state = (0, 0, 0)
        if self._loaded and state == self._file_state:
            return
        if self.file is not None:
            try:
                self._file_keys = read_key_file(self.file)
            except KeyStoreError:
                if strict:
                    raise
                # A hand edit in progress: keep serving the keys read last.
                logger.exception("keeping the API keys read before")
        by_id = {record.id: record for record in self._environment}
        for record in self._file_keys:
            if record.id in by_id:
                message = f"API key {record.id} is both in MIXREG_API_KEYS and in {self.file}"
                if strict:
                    raise KeyStoreError(message)
                logger.error("%s; the environment's entry is used", message)
                continue
            by_id[record.id] = record
        self._by_id = by_id
        self._verified = {}
        self._file_state = state
        self._loaded = True

    def get(self, identifier: str) -> ApiKey | None:
        """The key with the public id ``identifier`` (revoked or not), if any."""
        self._refresh(strict=False)
        return self._by_id.get(identifier)

    def authenticate(self, presented: str) -> ApiKey:
        """The key ``presented`` is; raise ``InvalidKeyError`` or ``RevokedKeyError``."""
        if len(presented) > MAX_KEY_LENGTH:
            raise InvalidKeyError
        self._refresh(strict=False)
        verified = self._verified.get(presented)
        if verified is not None:
            return verified
        identifier = key_id(presented)
        record = self._by_id.get(identifier) if identifier is not None else None
        stored_hash = record.key_hash if record is not None else _UNKNOWN_KEY_HASH
        matches = keys_match(presented, stored_hash)
        if record is None or not matches:
            raise InvalidKeyError
        if record.revoked:
            raise RevokedKeyError(record)
        if len(self._verified) >= MAX_VERIFIED_KEYS:
            self._verified = {}
        self._verified[presented] = record
        return record
