"""A plain HTTP GET for tests of the metrics servers."""

from __future__ import annotations

import urllib.error
import urllib.request


def status_of(url: str, timeout: float = 5.0) -> int:
    """The HTTP status code of GET ``url`` (4xx and 5xx included, not raised)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
