"""Keep keys out of the logs: a key a client put in a URL (refused, but already sent) would
otherwise be written by uvicorn's access log."""

from __future__ import annotations

import logging
import re

from service.auth.policy import CREDENTIAL_QUERY_PARAMETERS

# The secret part of a key; its id stays, it names the key and reveals nothing.
_SECRET = re.compile(r"(mixreg_[0-9a-f]{12}_)[A-Za-z0-9_-]{43}")
_QUERY_CREDENTIAL = re.compile(
    r"([?&](?:{names})=)[^&\s\"]*".format(
        names="|".join(re.escape(name) for name in sorted(CREDENTIAL_QUERY_PARAMETERS))
    ),
    re.IGNORECASE,
)
REDACTED = "[redacted]"
LOGGERS = ("uvicorn.access", "uvicorn.error")


def redact(text: str) -> str:
    """``text`` without key secrets or the values of credential query parameters."""
    return _QUERY_CREDENTIAL.sub(rf"\g<1>{REDACTED}", _SECRET.sub(rf"\g<1>{REDACTED}", text))


class KeyRedactionFilter(logging.Filter):
    """Redact keys in a record's message and string arguments."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact(arg) if isinstance(arg, str) else arg for arg in record.args)
        return True


def install_key_redaction() -> None:
    """Filter uvicorn's loggers (the access line carries the URL); idempotent."""
    for name in LOGGERS:
        target = logging.getLogger(name)
        if not any(isinstance(existing, KeyRedactionFilter) for existing in target.filters):
            target.addFilter(KeyRedactionFilter())
