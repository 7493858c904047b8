"""Where the proxy may connect: the outside world and the configured upstreams, nothing else
(the proxy connects from the host: docs/recording.md, "The proxy's destinations").

A destination is allowed if it is a configured upstream or an ``--allow-host`` entry (by name and
port, or by address and port), or if every address it resolves to is globally routable and none is
this host's own. A name is resolved once per run, through ``getaddrinfo`` as the connection would
be (so ``127.1`` or ``0x7f.1`` is judged as 127.0.0.1), and ``server_connect`` pins the connection to
the address that was checked, so DNS rebinding cannot send the proxy anywhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

IP = ipaddress.IPv4Address | ipaddress.IPv6Address
BLOCKED_MARK = "amb: blocked: "
"""Prefix of the error a blocked connection gets, so the flow's record can say it was blocked."""

_NAT64 = ipaddress.ip_network("64:ff9b::/96")


@dataclass(frozen=True)
class Verdict:
    address: str | None
    """The address to connect to (None when blocked)."""
    blocked: str | None = None
    """Why not, for the agent's 403 and the record."""


def parse_host_port(value: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` → (lower-case host, port); ValueError if malformed."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise ValueError(f"{value!r}: expected HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return _norm(host), int(port)


def _norm(host: str) -> str:
    return host.strip().lower().rstrip(".").split("%", 1)[0]


def _literal(host: str) -> IP | None:
    try:
        return ipaddress.ip_address(_norm(host).strip("[]"))
    except ValueError:
        return None


def own_addresses() -> frozenset[IP]:
    """Every address assigned to this host's interfaces (IPv4 from the kernel's local routing
    table, IPv6 from ``if_inet6``): connecting to one of them reaches this host's services."""
    out: set[IP] = set()
    try:
        lines = Path("/proc/net/fib_trie").read_text().splitlines()
    except OSError:
        lines = []
    for prev, line in zip(lines, lines[1:], strict=False):
        if line.strip() == "/32 host LOCAL":
            with contextlib.suppress(ValueError):
                out.add(ipaddress.ip_address(prev.strip().lstrip("|-+ ").strip()))
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            hexaddr = line.split()[0]
            out.add(ipaddress.IPv6Address(int(hexaddr, 16)))
    return frozenset(out)


def why_blocked(ip: IP, own: frozenset[IP] = frozenset()) -> str | None:
    """None if ``ip`` is on the outside world; else the reason it is not."""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is None and ip in _NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None:
            inner = why_blocked(embedded, own)
            return f"{inner} (inside the IPv6 address {ip})" if inner else None
    for test, name in (
        ("is_unspecified", "unspecified (this host)"),
        ("is_loopback", "loopback"),
        ("is_link_local", "link-local"),
        ("is_multicast", "multicast"),
        ("is_private", "private"),
        ("is_reserved", "reserved"),
    ):
        if getattr(ip, test):
            return f"{ip} is a {name} address"
    if ip in own:
        return f"{ip} is an address of this host"
    if not ip.is_global:
        return f"{ip} is not a global address"
    return None


class Destinations:
    """The per-run policy and its resolution cache (used on the proxy's event loop only)."""

    def __init__(self, allowed: Iterable[tuple[str, int]], own: frozenset[IP] | None = None):
        self.allowed_names = {(_norm(h), p) for h, p in allowed}
        self.own = own_addresses() if own is None else own
        # Allowed entries given by name also allow their addresses (127.0.0.1 for localhost).
        self.allowed_addrs: set[tuple[IP, int]] = set()
        for host, port in self.allowed_names:
            ip = _literal(host)
            if ip is not None:
                self.allowed_addrs.add((ip, port))
                continue
            with contextlib.suppress(OSError, UnicodeError, ValueError):
                for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
                    self.allowed_addrs.add((ipaddress.ip_address(_norm(str(info[4][0]))), port))
        self._cache: dict[tuple[str, int], Verdict] = {}

    def allowed(self, host: str, port: int) -> bool:
        return (_norm(host), port) in self.allowed_names

    def cached(self, host: str, port: int) -> Verdict | None:
        """The verdict without resolving, if it is known (or needs no DNS); None: call ``verdict``."""
        key = (_norm(host), port)
        got = self._cache.get(key)
        if got is None and (ip := _literal(key[0])) is not None:
            got = self._cache[key] = self._judge(key, [ip])
        return got

    async def verdict(self, host: str, port: int) -> Verdict:
        got = self.cached(host, port)
        if got is not None:
            return got
        key = (_norm(host), port)
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(key[0], port, type=socket.SOCK_STREAM)
            addrs = [ipaddress.ip_address(_norm(str(info[4][0]))) for info in infos]
        except (OSError, UnicodeError, ValueError) as e:
            # Not cached: a name that does not resolve now may resolve later; it is judged then.
            return Verdict(None, f"{host} does not resolve ({e})")
        return self._cache.setdefault(key, self._judge(key, addrs))

    def _judge(self, key: tuple[str, int], addrs: list[IP]) -> Verdict:
        host, port = key
        if not addrs:
            return Verdict(None, f"{host} does not resolve")
        if key in self.allowed_names or all((ip, port) in self.allowed_addrs for ip in addrs):
            return Verdict(str(addrs[0]))
        for ip in addrs:
            reason = why_blocked(ip, self.own)
            if reason is not None:
                named = "" if _literal(host) == ip else f"{host} resolves to "
                return Verdict(None, f"{named}{reason}")
        return Verdict(str(addrs[0]))


BLOCKED_KEY = "amb-blocked"
"""``flow.metadata`` key: the reason the gate refused the flow (the recorder records it)."""


class Gate:
    """The mitmproxy addon that applies ``Destinations`` (placed before the recorder).

    The reverse endpoints go to their configured upstream and are not checked per request. The
    regular proxy's requests and CONNECTs are answered 403 when their destination is refused;
    ``server_connect`` checks every connection the proxy opens, whatever carried it, and pins it to
    the checked address. Hooks return a coroutine only when a name must be resolved, so a known
    destination costs no trip through the event loop.
    """

    def __init__(self, destinations: Destinations):
        self.destinations = destinations

    def http_connect(self, flow: Any) -> Any:
        return self._check(flow)

    def request(self, flow: Any) -> Any:
        if flow.response is not None or getattr(flow.client_conn.proxy_mode, "type_name", "") != "regular":
            return None
        return self._check(flow)

    def _check(self, flow: Any) -> Any:
        return self._apply(flow.request.host, flow.request.port, lambda verdict: _answer(flow, verdict))

    def server_connect(self, data: Any) -> Any:
        server = data.server
        host, port = server.address[0], server.address[1]
        return self._apply(host, port, lambda verdict: _pin(server, host, port, verdict))

    def _apply(self, host: str, port: int, act: Callable[[Verdict], None]) -> Any:
        """``act`` on the verdict for (host, port): now when it is known, else in the coroutine
        returned, which resolves the name first."""
        if self.destinations.allowed(host, port):
            return None
        verdict = self.destinations.cached(host, port)
        if verdict is None:
            return self._resolved(host, port, act)
        act(verdict)
        return None

    async def _resolved(self, host: str, port: int, act: Callable[[Verdict], None]) -> None:
        act(await self.destinations.verdict(host, port))


def _answer(flow: Any, verdict: Verdict) -> None:
    if verdict.blocked is None:
        return
    from recorder.proxy.refusal import amb_error

    message = (
        f"amb-record refused to connect to {flow.request.host}:{flow.request.port}: {verdict.blocked}. "
        "The recording proxy carries traffic only to the outside world and the configured upstreams "
        "(amb-record --allow-host HOST:PORT opens a destination)."
    )
    flow.response = amb_error(403, message, "amb_blocked")
    flow.metadata[BLOCKED_KEY] = verdict.blocked


def _pin(server: Any, host: str, port: int, verdict: Verdict) -> None:
    if verdict.blocked is not None:
        server.error = BLOCKED_MARK + verdict.blocked
        return
    if verdict.address is not None and verdict.address != host:
        if server.sni is None:
            server.sni = host  # TLS still names (and verifies) the host the client asked for
        server.address = (verdict.address, port)
