"""Non-model traffic (package installs, downloads, anything) and blocked egress attempts."""

from __future__ import annotations

from schemas.blob import BlobRef
from schemas.events.base import Payload


class NetworkRequest(Payload, frozen=True, tag="network.request"):
    """One HTTP request through the proxy, or an egress attempt seen elsewhere."""

    method: str = ""
    scheme: str = ""
    host: str = ""
    port: int | None = None
    path: str = ""
    status: int | None = None
    request_bytes: int = 0
    response_bytes: int = 0
    started_ns: int = 0
    duration_ms: float | None = None
    request_sha256: str | None = None
    response_sha256: str | None = None
    request_body: BlobRef | None = None
    """Stored only under the size cap; above it only the sha256 is kept."""
    response_body: BlobRef | None = None
    error: str | None = None
    via: str = "proxy"
    """``proxy`` (went through the recorder) or ``shim`` (a direct attempt observed inside)."""
    blocked: str | None = None
    """Why the proxy refused to carry it (a loopback, private or link-local destination, the
    host's own address...); the agent got a 403 and nothing was sent."""
