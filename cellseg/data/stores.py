"""Where zarr data lives: local paths, `file://`, anonymous `s3://` and `http(s)://` locations.

`s3://bucket/key` is read anonymously through the bucket's public HTTPS endpoint
(`https://bucket.s3.amazonaws.com/key`), which is how the CellMap bucket `janelia-cosem-datasets` is
served; this keeps both array backends and `cellseg fetch` on one transport with no AWS SDK.
A missing key on S3 answers 403 (anonymous users may not list), so 403 and 404 both mean "absent".
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

log = logging.getLogger(__name__)

# Public HTTPS endpoint for anonymous S3 reads; CELLSEG_S3_ENDPOINT overrides it (mirrors, tests).
DEFAULT_S3_ENDPOINT = "https://{bucket}.s3.amazonaws.com"
HTTP_TIMEOUT_S = 60.0
HTTP_RETRIES = 4  # transient errors (5xx, resets) are retried with exponential back-off
_ABSENT_STATUS = (403, 404)


@dataclass(frozen=True)
class Location:
    """A node of a zarr hierarchy: a local directory or an HTTP(S) URL prefix.

    Example:
        >>> loc = resolve("s3://janelia-cosem-datasets/jrc_hela-2/jrc_hela-2.zarr")
        >>> loc.join("recon-1", "em").url
        'https://janelia-cosem-datasets.s3.amazonaws.com/jrc_hela-2/jrc_hela-2.zarr/recon-1/em'
    """

    kind: Literal["file", "http"]
    url: str  # an absolute local path for "file", a URL without trailing slash for "http"

    def join(self, *parts: str) -> Location:
        """The child location `self/parts[0]/parts[1]/...`."""
        parts = tuple(p.strip("/") for p in parts if p.strip("/"))
        if self.kind == "file":
            return Location("file", str(Path(self.url, *parts)))
        return Location("http", "/".join((self.url, *(urllib.parse.quote(p) for p in parts))))

    @property
    def name(self) -> str:
        """The last path component."""
        return self.url.rstrip("/").rsplit("/", 1)[-1]

    def read_bytes(self, key: str) -> bytes | None:
        """The bytes stored at `self/key`, or None when absent."""
        if self.kind == "file":
            path = Path(self.url, key)
            return path.read_bytes() if path.is_file() else None
        return http_get(self.join(key).url)

    def read_json(self, key: str) -> dict[str, Any] | None:
        """Parse `self/key` as JSON (e.g. `.zattrs`), or None when absent.

        Raises:
            ValueError: when the file exists but is not valid JSON.
        """
        raw = self.read_bytes(key)
        if raw is None:
            return None
        try:
            return json.loads(raw)
        except json.JSONDecodeError as err:
            raise ValueError(f"{self.join(key)}: not valid JSON ({err})") from None

    def tensorstore_kvstore(self) -> dict[str, Any]:
        """The tensorstore kvstore spec for this location."""
        if self.kind == "file":
            return {"driver": "file", "path": self.url + "/"}
        return {"driver": "http", "base_url": self.url + "/"}

    def __str__(self) -> str:
        return self.url


def resolve(url: str | os.PathLike[str] | Location) -> Location:
    """Turn a user-given path or URL into a `Location`.

    Accepts local paths (relative or absolute, `~` expanded), `file://`, `http(s)://` and anonymous
    `s3://bucket/key` URLs.

    Raises:
        ValueError: for another URL scheme.
    """
    if isinstance(url, Location):
        return url
    text = os.fspath(url)
    parsed = urllib.parse.urlparse(text)
    if parsed.scheme in ("http", "https"):
        return Location("http", text.rstrip("/"))
    if parsed.scheme == "s3":
        base = os.environ.get("CELLSEG_S3_ENDPOINT", DEFAULT_S3_ENDPOINT).format(bucket=parsed.netloc)
        return Location("http", (base + "/" + parsed.path.lstrip("/")).rstrip("/"))
    if parsed.scheme == "file":
        return Location("file", str(Path(urllib.parse.unquote(parsed.path)).resolve()))
    if parsed.scheme and len(parsed.scheme) > 1:  # one letter: a Windows drive
        raise ValueError(f"{text}: unsupported URL scheme {parsed.scheme!r}; use a path, file://, s3:// or http(s)://")
    return Location("file", str(Path(text).expanduser().resolve()))


def http_get(url: str, *, timeout_s: float = HTTP_TIMEOUT_S, headers: Mapping[str, str] | None = None) -> bytes | None:
    """GET `url`; None for 403/404 (absent), retries transient failures.

    Raises:
        OSError: when the server keeps failing or answers another error status.
    """
    request = urllib.request.Request(url, headers=dict(headers or {}))
    for attempt in range(HTTP_RETRIES):
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                return response.read()
        except urllib.error.HTTPError as err:
            if err.code in _ABSENT_STATUS:
                return None
            if err.code < 500 or attempt == HTTP_RETRIES - 1:
                raise OSError(f"{url}: HTTP {err.code} {err.reason}") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.IncompleteRead) as err:
            if attempt == HTTP_RETRIES - 1:
                raise OSError(f"{url}: {getattr(err, 'reason', err)}") from None
        delay = 0.5 * 2**attempt
        log.debug("retrying %s in %.1f s", url, delay)
        time.sleep(delay)
    raise AssertionError("unreachable")


class HTTPStore(Mapping[str, bytes]):
    """A read-only zarr-python store over HTTP: key → bytes, missing keys raise KeyError.

    It cannot list keys (S3 forbids anonymous listing), which zarr does not need for reads.
    """

    def __init__(self, location: Location):
        self.location = location

    def __getitem__(self, key: str) -> bytes:
        data = http_get(self.location.join(key).url)
        if data is None:
            raise KeyError(key)
        return data

    def __contains__(self, key: object) -> bool:
        try:
            self[str(key)]
        except KeyError:
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0
