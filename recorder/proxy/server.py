"""Run mitmproxy (with the recording addon) inside amb-record, on its own thread and event loop.

In-process rather than a child: one import, no second process to supervise, and the addon's
counts and state are at hand for ``run.finished``. Modes: one reverse endpoint per upstream (the
agent gets ``OPENAI_BASE_URL``, ``ANTHROPIC_BASE_URL``, ``GOOGLE_GEMINI_BASE_URL``, ...: see
``recorder.proxy.upstreams``) plus a regular proxy with a per-run CA
for everything else. All listen on ephemeral ports so several amb-record processes can coexist.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import logging
import os
import ssl
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from recorder.proxy.addon import Recorder
from recorder.proxy.gate import Destinations, Gate
from recorder.proxy.sink import Sink
from recorder.proxy.upstreams import Upstream, resolve
from schemas.errors import AmbError

if TYPE_CHECKING:
    from mitmproxy.master import Master

CA_CERT_NAME = "mitmproxy-ca-cert.pem"
SWITCH_INTERVAL_S = 0.0005


class ProxyError(AmbError):
    """The recording proxy could not start."""


class ProxyServer:
    """One per process: mitmproxy keeps its master in a process-wide context (``mitmproxy.ctx``)."""

    _running: ProxyServer | None = None

    def __init__(
        self,
        sink: Sink,
        *,
        upstreams: Mapping[str, str | Upstream],
        confdir: Path,
        listen_host: str = "127.0.0.1",
        upstream_ca: Path | None = None,
        allow_hosts: list[tuple[str, int]] | None = None,
    ):
        self.sink = sink
        self.recorder = Recorder(sink)
        self.upstreams = resolve(upstreams)
        # The configured upstreams, and what the user opened with --allow-host, even on loopback.
        allowed = list(sink.custody.upstream_hosts.values()) + list(allow_hosts or [])
        self.gate = Gate(Destinations(allowed))
        self.confdir = confdir
        self.listen_host = listen_host
        self.upstream_ca = upstream_ca
        self.ports: dict[str, int] = {}
        self._master: Master | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self._deadline = 0.0

    @property
    def ca_cert(self) -> Path:
        return self.confdir / CA_CERT_NAME

    def start(self, timeout: float = 30) -> None:
        if ProxyServer._running is not None:
            raise ProxyError("another recording proxy is already running in this process")
        ProxyServer._running = self
        self.confdir.mkdir(parents=True, exist_ok=True, mode=0o700)
        # mitmproxy would create the CA only once it is running; create it now so that it exists
        # before anything is handed to the agent (mitmproxy then loads it from confdir).
        from mitmproxy import certs

        certs.CertStore.from_store(str(self.confdir), "mitmproxy", 2048)
        # mitmproxy's first import takes seconds on a loaded machine: done here, so that the
        # deadline below measures the proxy's start alone.
        for module in ("mitmproxy.master", "mitmproxy.options", "mitmproxy.addons.proxyserver"):
            importlib.import_module(module)
        # The event loop shares the GIL with the sink's workers; with CPython's default 5 ms switch
        # interval a worker parsing a body could hold a waiting stream back for up to 5 ms.
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self._deadline = time.monotonic() + timeout
        self._thread = threading.Thread(target=self._run, name="amb-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout) or self._startup_error is not None:
            self.stop()
            why = self._startup_error or f"it did not start within {timeout}s"
            raise ProxyError(f"the recording proxy could not start: {why}")
        # What exists once the proxy is up lives as long as the proxy: frozen, full collections
        # (which hold the GIL, so no stream moves) need not walk it.
        gc.collect()
        gc.freeze()

    def stop(self, timeout: float = 15) -> None:
        """Stop listening; in-flight flows are saved as partial records (addon ``done``)."""
        if self._master is not None and self._loop is not None:
            # Let hooks that are persisting a finished call complete, so their tasks are not cut.
            deadline = time.monotonic() + 5
            while self.recorder.persisting and time.monotonic() < deadline:
                time.sleep(0.005)
            self._master.shutdown()
        if self._thread is not None:
            self._thread.join(timeout)
        if ProxyServer._running is self:
            ProxyServer._running = None
            gc.unfreeze()  # collectable again (a test process starts many proxies)
            _forget_master(self._master)

    # -- the proxy thread ----------------------------------------------------------------------

    def _run(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._main())
        except BaseException as e:  # noqa: BLE001 - reported to the starting thread
            self._startup_error = self._startup_error or e
        finally:
            self._ready.set()
            try:
                # Connections still open (streams cut by the shutdown) end here, quietly.
                pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
                for task in pending:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()

    async def _main(self) -> None:
        from mitmproxy import master as mitm_master
        from mitmproxy import options

        # One reverse endpoint per upstream, even when two share a host (their paths and keys differ):
        # the target in the spec only tells the endpoints apart and is never connected to (the addon
        # routes each request; ``.invalid`` never resolves, should that ever fail).
        spec_of = {
            name: f"reverse:http://{name.replace('_', '-')}.amb-upstream.invalid:9@{self.listen_host}:0"
            for name in self.upstreams
        }
        self.recorder.routes = {spec_of[name]: up for name, up in self.upstreams.items()}
        spec_of["regular"] = f"regular@{self.listen_host}:0"
        modes = list(dict.fromkeys(spec_of.values()))
        opts = options.Options(confdir=str(self.confdir), mode=modes)
        master = mitm_master.Master(opts, with_termlog=False)
        master.addons.add(*proxy_addons(), self.gate, self.recorder)
        # Options defined by addons exist only once the master (and its addons) does.
        update = {"connection_strategy": "lazy"}  # eager: a dead upstream = silent disconnect, no record
        if self.upstream_ca is not None:
            # The option replaces the proxy's upstream trust store: keep the system CAs in it too.
            bundle = ca_bundle(self.upstream_ca, self.confdir / "upstream-trust.pem")
            update["ssl_verify_upstream_trusted_ca"] = str(bundle)
        master.options.update(**update)
        self._master = master
        # mitmproxy logs every connection through the root logger; the agent's terminal is not the place.
        for name in ("mitmproxy", "mitmproxy.proxy.server"):
            logging.getLogger(name).setLevel(logging.ERROR)
        run = asyncio.ensure_future(master.run())
        ps = master.addons.get("proxyserver")
        try:
            while True:
                await asyncio.sleep(0.01)
                if run.done():
                    run.result()
                    raise ProxyError("mitmproxy exited during startup")
                servers = list(ps.servers)
                if servers and all(s.listen_addrs for s in servers) and len(servers) == len(modes):
                    break
                if time.monotonic() > self._deadline:
                    raise ProxyError("mitmproxy did not open its ports")
            by_spec = {s.mode.full_spec: s.listen_addrs[0][1] for s in servers}
            self.ports = {name: by_spec[spec] for name, spec in spec_of.items()}
            self._ready.set()
            await run
        finally:
            # mitmproxy's shutdown leaves its listening sockets open (mitmdump exits the process
            # then): closed here, so that a stopped proxy's ports refuse connections at once.
            await ps.servers.update([])


def _forget_master(master: Master | None) -> None:
    """Drop mitmproxy's process-wide references to a stopped master: they held it, its addons and
    the run's sink (with its blob store) until the next proxy started."""
    from mitmproxy import ctx

    if master is not None and getattr(ctx, "master", None) is master:
        for name in ("master", "options", "log"):
            with contextlib.suppress(AttributeError):
                delattr(ctx, name)


def proxy_addons() -> list:
    """The mitmproxy addons a recording proxy needs: mitmdump's defaults minus the interactive and
    traffic-rewriting ones (idle unless their options are set, but mitmproxy calls every hook on
    every addon, at a real cost per call)."""
    from mitmproxy.addons import (
        block,
        core,
        disable_h2c,
        dns_resolver,
        errorcheck,
        next_layer,
        proxyserver,
        strip_dns_https_records,
        tlsconfig,
        update_alt_svc,
    )

    return [
        core.Core(),
        block.Block(),  # refuses clients from public addresses (the docker backend's agent is private)
        strip_dns_https_records.StripDnsHttpsRecords(),
        disable_h2c.DisableH2C(),
        proxyserver.Proxyserver(),
        dns_resolver.DnsResolver(),
        next_layer.NextLayer(),
        tlsconfig.TlsConfig(),
        update_alt_svc.UpdateAltSvc(),
        errorcheck.ErrorCheck(),
    ]


def ca_bundle(ca_cert: Path, out: Path) -> Path:
    """System trust anchors + ``ca_cert`` (the per-run CA, or an extra upstream CA) in one PEM file:
    ``SSL_CERT_FILE`` *replaces* a client's trust store, so the system CAs must stay in it."""
    parts: list[bytes] = []
    paths = ssl.get_default_verify_paths()
    for candidate in (paths.cafile, paths.openssl_cafile, "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and os.path.isfile(candidate):
            parts.append(Path(candidate).read_bytes())
            break
    else:
        with contextlib.suppress(ImportError):
            import certifi

            parts.append(Path(certifi.where()).read_bytes())
    parts.append(ca_cert.read_bytes())
    out.write_bytes(b"\n".join(p.rstrip(b"\n") + b"\n" for p in parts))
    return out
