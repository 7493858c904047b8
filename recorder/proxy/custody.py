"""Credential custody: the real API keys stay in amb-record; the agent holds placeholders.

The proxy swaps a placeholder for the real key only on requests bound for that provider's
configured upstream (never to another host). Headers are never persisted at all (so neither
``Authorization``, ``x-api-key``, ``api-key`` nor ``x-goog-api-key`` can leak; a key injected into
a query string is masked in the recorded URL), and every persisted body, tool
output, path and error text passes through ``scrub``, so a key that leaks into a body (an agent
echoing its environment, say) is masked.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from urllib.parse import quote

from recorder.proxy.upstreams import Upstream, resolve

REDACTED = "[redacted]"
MIN_KEY_LEN = 8
"""Keys shorter than this are not scrubbed from bodies (a 1-byte 'key' would mangle everything)."""

KEY_HEADERS = ("authorization", "x-api-key", "api-key", "x-goog-api-key")
"""Where SDKs send a key: OpenAI (Bearer), Anthropic, Azure OpenAI, Gemini. Gemini's ``?key=`` query
parameter is handled by ``inject_query``."""


@dataclass
class Custody:
    real: dict[str, str] = field(default_factory=dict)
    """upstream name → real key (from amb-record's own environment)."""
    placeholders: dict[str, str] = field(default_factory=dict)
    """upstream name → the placeholder handed to the agent."""
    upstream_hosts: dict[str, tuple[str, int]] = field(default_factory=dict)
    """upstream name → (host, port) of that upstream: the only place its key may go."""

    @classmethod
    def from_env(cls, env: Mapping[str, str], upstreams: Mapping[str, str | Upstream]) -> Custody:
        c = cls()
        for name, up in resolve(upstreams).items():
            key = next((env[var] for var in up.key_vars if env.get(var)), "")
            if key:
                c.real[name] = key
            c.placeholders[name] = f"amb-placeholder-{name}-{secrets.token_hex(8)}"
            c.upstream_hosts[name] = (up.host, up.port)
        c._needles = [k.encode() for k in c.real.values() if len(k) >= MIN_KEY_LEN]
        return c

    _needles: list[bytes] = field(default_factory=list)

    def _swaps(self, host: str, port: int) -> list[tuple[str, str]]:
        """(placeholder, real key) of every upstream at ``host:port``."""
        where = (host.lower(), port)
        return [
            (self.placeholders[name], real)
            for name, real in self.real.items()
            if self.upstream_hosts.get(name) == where
        ]

    def inject(self, host: str, port: int, headers: MutableMapping[str, str]) -> bool:
        """Replace placeholders with real keys in ``headers`` (a mitmproxy Headers) if bound for
        their upstream. Returns True if a key was injected."""
        injected = False
        for placeholder, real in self._swaps(host, port):
            for name in KEY_HEADERS:
                value = headers.get(name)
                if value and placeholder in value:
                    headers[name] = value.replace(placeholder, real)
                    injected = True
        return injected

    def inject_query(self, host: str, port: int, path: str) -> str:
        """``path`` with a placeholder in its query (Gemini's ``?key=``) replaced by the real key, if
        bound for its upstream."""
        query = path.find("?")
        if query == -1:
            return path
        for placeholder, real in self._swaps(host, port):
            if placeholder in path:
                path = path[:query] + path[query:].replace(placeholder, quote(real, safe=""))
        return path

    def scrub(self, data: bytes) -> bytes:
        """``data`` with every real key's bytes masked."""
        for needle in self._needles:
            if contains(data, needle):
                data = data.replace(needle, REDACTED.encode())
        return data

    def scrub_text(self, text: str) -> str:
        for key in self.real.values():
            if len(key) >= MIN_KEY_LEN:
                text = text.replace(key, REDACTED)
        return text


ANCHORS = (b"-", b"_")
"""Key bytes that base64 never uses: a multi-MB inline image has none of them."""

ANCHOR_LIMIT = 64
"""Anchor occurrences checked one by one before falling back to a plain search."""


def contains(data: bytes, needle: bytes) -> bool:
    """``needle in data``, fast when ``data`` is mostly base64 and ``needle`` is an API key.
    Provider keys contain ``-`` or ``_``, which base64 never does: the occurrences of that byte are
    found at memchr speed and the key compared at each. A body with more than ``ANCHOR_LIMIT`` of
    them (text, not an image) gets the plain search."""
    for anchor in ANCHORS:
        offset = needle.find(anchor)
        if offset != -1:
            break
    else:
        return needle in data
    find, startswith = data.find, data.startswith
    pos = find(anchor, offset)  # an occurrence before ``offset`` cannot be the key's
    for _ in range(ANCHOR_LIMIT):
        if pos == -1:
            return False
        if startswith(needle, pos - offset):
            return True
        pos = find(anchor, pos + 1)
    return pos != -1 and needle in data
