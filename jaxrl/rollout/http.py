"""JSON over HTTP with retries and backoff, for the server-backed engines (stdlib only)."""

from __future__ import annotations

import dataclasses
import http.client
import json
import random
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


class HTTPStatusError(Exception):
    """The server answered with an error status."""

    def __init__(self, url: str, status: int, body: str, retry_after: float | None = None):
        super().__init__(f"{url}: HTTP {status}: {body[:500]}")
        self.url, self.status, self.body, self.retry_after = url, status, body, retry_after

    @property
    def retryable(self) -> bool:
        """Rate limits and server errors are worth another try; other client errors are not."""
        return self.status == 429 or self.status >= 500


class ConnectionFailed(Exception):
    """No answer: refused, reset, timed out or cut off mid-response."""


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How hard to try one request.

    Attributes:
        attempts: tries in total (1 = no retry).
        backoff: seconds before the second try; doubles after each failure.
        max_backoff: cap on one wait (a server's Retry-After is honoured up to it).
        timeout: seconds one try may take.
    """

    attempts: int = 4
    backoff: float = 0.5
    max_backoff: float = 16.0
    timeout: float = 600.0

    def __post_init__(self):
        if self.attempts < 1 or self.backoff < 0 or self.max_backoff < 0 or self.timeout <= 0:
            raise ValueError(f"bad retry policy {self}")

    def wait(self, failure: int, retry_after: float | None = None) -> float:
        """Seconds to wait after the `failure`-th failed try (1-based), with up to 10% jitter."""
        base = self.backoff * 2 ** (failure - 1)
        if retry_after is not None:
            base = max(base, retry_after)
        return min(self.max_backoff, base) * (1.0 + 0.1 * random.random())


def request_json(method: str, url: str, body: Any = None, *, headers: Mapping[str, str] | None = None,
                 timeout: float = 600.0) -> Any:
    """One request; returns the parsed JSON answer (the text when it is not JSON, None when empty).

    Raises:
        HTTPStatusError: a 4xx or 5xx answer.
        ConnectionFailed: no complete answer.
    """
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as e:
        text = e.read().decode(errors="replace")
        retry_after = e.headers.get("Retry-After") if e.headers else None
        try:
            wait = float(retry_after) if retry_after is not None else None
        except ValueError:
            wait = None
        raise HTTPStatusError(url, e.code, text, wait) from None
    except (urllib.error.URLError, http.client.HTTPException, ConnectionError, socket.timeout, TimeoutError,
            OSError) as e:
        raise ConnectionFailed(f"{url}: {e}") from None
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


def with_retries(call: Callable[[], T], policy: RetryPolicy, *, sleep: Callable[[float], None] = time.sleep) -> T:
    """`call()`, tried again after connection failures, 429s and 5xx answers, with exponential backoff.

    Other errors (4xx) propagate at once; the last failure propagates when tries run out.
    """
    for failure in range(1, policy.attempts + 1):
        try:
            return call()
        except HTTPStatusError as e:
            if not e.retryable or failure == policy.attempts:
                raise
            sleep(policy.wait(failure, e.retry_after))
        except ConnectionFailed:
            if failure == policy.attempts:
                raise
            sleep(policy.wait(failure))
    raise AssertionError("unreachable")
