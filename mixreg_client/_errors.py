"""The one exception of the client: an RFC 9457 problem, or a server that cannot be reached."""

from __future__ import annotations

from typing import Any

import httpx

PROBLEM_MEDIA_TYPES = ("application/problem+json", "application/json")


class MixregError(Exception):
    """A request failed: the server answered with an error, or could not be reached.

    Attributes
    ----------
    status : int or None
        The HTTP status of the answer; None when the server could not be reached.
    title : str
        The problem's title (the status phrase, e.g. ``"Unprocessable Entity"``).
    detail : str
        What is wrong, in one sentence that names the field, row or column.
    errors : list of dict
        Validation errors, each with ``loc`` (its place in the request), ``msg`` and ``type``.
    type : str
        The problem type, e.g. ``"urn:mixreg:problem:validation-error"``.
    instance : str or None
        The path the problem occurred on.
    problem : dict
        The whole problem+json document (empty when the answer was not one).
    """

    def __init__(
        self,
        detail: str,
        *,
        status: int | None = None,
        title: str = "",
        errors: list[dict[str, Any]] | None = None,
        type: str = "about:blank",
        instance: str | None = None,
        problem: dict[str, Any] | None = None,
    ) -> None:
        self.status = status
        self.title = title
        self.detail = detail
        self.errors = errors if errors is not None else []
        self.type = type
        self.instance = instance
        self.problem = problem if problem is not None else {}
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.status is None:
            return self.detail
        return f"{self.detail} ({self.status} {self.title})".strip()

    @classmethod
    def from_response(cls, response: httpx.Response) -> MixregError:
        """The problem an error response carries (or a summary of a response that is none)."""
        media_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
        body: Any = None
        if media_type in PROBLEM_MEDIA_TYPES:
            try:
                body = response.json()
            except ValueError:
                body = None
        if isinstance(body, dict) and isinstance(body.get("detail"), str):
            errors = body.get("errors")
            return cls(
                _with_key_hint(body["detail"], response),
                status=response.status_code,
                title=str(body.get("title") or response.reason_phrase),
                errors=errors if isinstance(errors, list) else None,
                type=str(body.get("type") or "about:blank"),
                instance=body.get("instance") if isinstance(body.get("instance"), str) else None,
                problem=body,
            )
        # Not a problem document (a proxy's error page, say): keep a short excerpt.
        text = " ".join(response.text.split())[:200]
        request = response.request
        detail = f"{request.method} {request.url.path} answered {response.status_code}"
        return cls(
            f"{detail}: {text}" if text else detail,
            status=response.status_code,
            title=response.reason_phrase,
        )

    @classmethod
    def unreachable(cls, base_url: str, error: httpx.TransportError) -> MixregError:
        """The server at ``base_url`` did not answer."""
        reason = str(error) or type(error).__name__
        return cls(
            f"cannot reach the mixreg server at {base_url}: {reason} "
            f"(is it running? set its address with MIXREG_URL, or MIXREG_HOST and "
            f"MIXREG_PORT, or pass base_url=)",
            title="Unreachable",
        )


def _with_key_hint(detail: str, response: httpx.Response) -> str:
    """A 401's detail told in the client's terms: where the client takes its key from."""
    if response.status_code != 401:
        return detail
    if "authorization" not in response.request.headers:
        return "this server needs an API key: set MIXREG_API_KEY or pass api_key="
    return f"{detail} (the key comes from api_key= or MIXREG_API_KEY)"
