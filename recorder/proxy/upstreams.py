"""Where a run's model calls go: its upstreams (``--upstream``) and how an agent's request maps onto one.

Each upstream has its own reverse endpoint on the proxy and its own variables in the agent's
environment (a base URL and a placeholder key). ``KIND=URL`` points the built-in upstream of a kind
elsewhere, ``NAME=KIND:URL`` adds one more of that kind; a request's path has the agent's base URL
ending replaced by the upstream's path (docs/recording.md, "Upstreams").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from schemas.errors import UsageError


@dataclass(frozen=True)
class Kind:
    name: str
    default_url: str | None
    """The public API (None: the URL must be given, e.g. an Azure resource)."""
    agent_prefix: str
    """How the agent's base URL ends (the openai SDK expects ``/v1`` in it; the others add their own)."""
    default_path: str
    """The upstream's base path when its URL names none."""
    base_url_var: str
    """The agent's variable for the base URL of the built-in upstream of this kind."""
    key_vars: tuple[str, ...]
    """Variables that may hold this kind's key: the real key is read from the first one set in
    amb-record's environment; the agent gets the placeholder in the first and an empty value in the
    others (so an SDK that prefers another spelling cannot find a real key left in the environment)."""


KINDS: dict[str, Kind] = {
    "openai": Kind(
        "openai", "https://api.openai.com/v1", "/v1", "/v1", "OPENAI_BASE_URL", ("OPENAI_API_KEY",)
    ),
    "anthropic": Kind(
        "anthropic", "https://api.anthropic.com", "", "", "ANTHROPIC_BASE_URL", ("ANTHROPIC_API_KEY",)
    ),
    "gemini": Kind(
        "gemini",
        "https://generativelanguage.googleapis.com",
        "",
        "",
        "GOOGLE_GEMINI_BASE_URL",
        ("GEMINI_API_KEY", "GOOGLE_API_KEY"),
    ),
    "azure": Kind("azure", None, "", "", "AZURE_OPENAI_ENDPOINT", ("AZURE_OPENAI_API_KEY",)),
}

DEFAULT_KINDS = ("openai", "anthropic", "gemini")
"""Upstreams every run has (the public APIs unless ``--upstream`` says otherwise)."""

RESERVED_NAMES = ("regular",)
"""Names the proxy uses for its own endpoints."""

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
"""A URL (``scheme://``), as opposed to ``KIND:URL``."""


@dataclass(frozen=True)
class Upstream:
    name: str
    kind: Kind
    scheme: str
    host: str
    """Lower case; an IPv6 address without brackets."""
    port: int
    base_path: str
    """``""`` or a path without a trailing slash, e.g. ``/api/v1``."""

    @property
    def builtin(self) -> bool:
        return self.name == self.kind.name

    @property
    def base_url_var(self) -> str:
        return self.kind.base_url_var if self.builtin else f"{self.name.upper()}_BASE_URL"

    @property
    def key_vars(self) -> tuple[str, ...]:
        return self.kind.key_vars if self.builtin else (f"{self.name.upper()}_API_KEY",)

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def host_header(self) -> str:
        """``host[:port]``, the port left out when it is the scheme's default (as browsers send it)."""
        default = self.port == (443 if self.scheme == "https" else 80)
        return self.authority.removesuffix(f":{self.port}") if default else self.authority

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.authority}{self.base_path}"

    def agent_base_url(self, proxy_host: str, port: int) -> str:
        host = f"[{proxy_host}]" if ":" in proxy_host else proxy_host
        return f"http://{host}:{port}{self.kind.agent_prefix}"

    def upstream_path(self, path: str) -> str:
        """The agent's request path (query included) as the upstream's path."""
        prefix = self.kind.agent_prefix
        if prefix and path.startswith(prefix) and path[len(prefix) : len(prefix) + 1] in ("", "/", "?"):
            path = path[len(prefix) :]
        if not self.base_path:
            return path or "/"
        return self.base_path + (path if path.startswith("/") or not path else "/" + path)


def make(name: str, kind_name: str, url: str, where: str = "") -> Upstream:
    """One upstream, checked; ``where`` names the argument in errors."""
    where = where or f"{name}={url}"
    kind = KINDS.get(kind_name)
    if kind is None:
        raise UsageError(f"--upstream {where!r}: unknown kind {kind_name!r} (one of {', '.join(KINDS)})")
    if not _NAME.match(name) or name in RESERVED_NAMES:
        raise UsageError(
            f"--upstream {where!r}: the name must be lower-case letters, digits and _ (not {name!r})"
        )
    if name in KINDS and name != kind_name:
        raise UsageError(f"--upstream {where!r}: {name!r} is a kind; name another upstream differently")
    try:
        parts = urlsplit(url)
    except ValueError as e:  # an unclosed IPv6 bracket
        raise UsageError(f"--upstream {where!r}: not a URL ({e})") from None
    try:
        port = parts.port
    except ValueError:
        raise UsageError(f"--upstream {where!r}: bad port in {url!r}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--upstream {where!r}: the URL must be http(s)://host[:port][/path]")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise UsageError(
            f"--upstream {where!r}: give scheme://host[:port][/path] only (no query, fragment or "
            "credentials: keys come from amb-record's environment)"
        )
    path = parts.path.rstrip("/")
    return Upstream(
        name=name,
        kind=kind,
        scheme=parts.scheme,
        host=parts.hostname.lower(),
        port=port or (443 if parts.scheme == "https" else 80),
        base_path=path or kind.default_path,
    )


def parse(values: list[str]) -> dict[str, Upstream]:
    """``--upstream`` values → the run's upstreams by name (the default kinds always included)."""
    given: dict[str, str] = {}
    for value in values:
        name, sep, rest = value.partition("=")
        if not sep or not name or not rest:
            raise UsageError(f"--upstream {value!r}: expected KIND=URL or NAME=KIND:URL")
        if name in given:
            raise UsageError(f"--upstream {value!r}: {name!r} is given twice")
        given[name] = rest
    return resolve(given, values)


def resolve(upstreams: Mapping[str, str | Upstream], where: list[str] | None = None) -> dict[str, Upstream]:
    """Upstreams by name from values that are ``Upstream``s, URLs (a kind's own name) or ``KIND:URL``;
    the default kinds are added at their public URLs when missing. Variables must not collide."""
    out: dict[str, Upstream] = {}
    for i, (name, value) in enumerate(upstreams.items()):
        arg = where[i] if where else f"{name}={value}"
        if isinstance(value, Upstream):
            out[name] = value
        elif _SCHEME.match(value) or ":" not in value:
            if name not in KINDS:
                raise UsageError(
                    f"--upstream {arg!r}: {name!r} is not a kind ({', '.join(KINDS)}); "
                    f"say {name}=KIND:URL for another upstream of a kind"
                )
            out[name] = make(name, name, value, arg)
        else:
            kind_name, _, url = value.partition(":")
            out[name] = make(name, kind_name, url, arg)
    for kind_name in DEFAULT_KINDS:
        if kind_name not in out:
            out[kind_name] = make(kind_name, kind_name, KINDS[kind_name].default_url or "")
    owner: dict[str, str] = {}
    for up in sorted(out.values(), key=lambda u: not u.builtin):  # blame a named one, not a kind
        for var in (up.base_url_var, *up.key_vars):
            if var in owner:
                raise UsageError(
                    f"--upstream {up.name}: its variable {var} is also {owner[var]}'s; choose another name"
                )
            owner[var] = up.name
    return out
