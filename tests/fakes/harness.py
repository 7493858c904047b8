"""Test harness: the real recording proxy (in-process) in front of the fake upstream.

Not a fake of anything we own: it wires the production ``Sink`` and ``ProxyServer`` together the
way ``recorder.run`` does, minus the agent process, so proxy tests can drive clients directly.
"""

from __future__ import annotations

import time
from pathlib import Path

from recorder.budget import Budget
from recorder.proxy.custody import Custody
from recorder.proxy.server import ProxyServer
from recorder.proxy.sink import Sink
from recorder.spool import spool_path
from schemas.blobpack import materialise, pack_path
from schemas.blobstore import BlobStore
from schemas.codec import decode_event
from schemas.frames import scan

REAL_KEYS = {
    "OPENAI_API_KEY": "sk-test-REAL-openai-5f1c9a7e",
    "ANTHROPIC_API_KEY": "sk-ant-test-REAL-2b8d4c6f",
    "GEMINI_API_KEY": "AIza-test-REAL-gemini-7d3e1b9a",
}


class Recording:
    def __init__(
        self,
        store: Path,
        upstream_url: str,
        run_id: str = "run-proxy-test",
        upstream_ca: Path | None = None,
        upstreams: dict[str, str] | None = None,
        allow_hosts: list[tuple[str, int]] | None = None,
        budget: Budget | None = None,
    ):
        self.store = store
        self.run_id = run_id
        upstreams = upstreams or {"openai": upstream_url, "anthropic": upstream_url, "gemini": upstream_url}
        self.custody = Custody.from_env(dict(REAL_KEYS), upstreams)
        self.sink = Sink(store, run_id, self.custody, budget=budget)
        self.proxy = ProxyServer(
            self.sink,
            upstreams=upstreams,
            confdir=store / "conf",
            upstream_ca=upstream_ca,
            allow_hosts=allow_hosts,
        )
        self._seen = 0

    @property
    def blobs(self) -> BlobStore:
        """The blob store, with the live run's blob pack materialised first (as ``amb ingest`` does
        for a run still recording): the proxy creates blob files only when the run ends."""
        store = BlobStore(self.store / "blobs")
        pack = pack_path(spool_path(self.store, self.run_id, "proxy"))
        if pack.exists():
            materialise(pack, store, sync=False)
        return store

    def start(self) -> Recording:
        self.proxy.start()
        return self

    def stop(self) -> None:
        self.proxy.stop()
        self.sink.close()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.proxy.ports['openai']}"

    def endpoint(self, name: str) -> str:
        """The reverse endpoint of upstream ``name``, as the agent's base URL for it."""
        return self.proxy.upstreams[name].agent_base_url("127.0.0.1", self.proxy.ports[name])

    @property
    def regular(self) -> str:
        return f"http://127.0.0.1:{self.proxy.ports['regular']}"

    def events(self) -> list:
        data = spool_path(self.store, self.run_id, "proxy").read_bytes()
        return [decode_event(b) for b in scan(data).bodies]

    def new_payloads(self, kind: str | None = None, wait_for: int = 1, timeout: float = 5.0) -> list:
        """All payloads appended since the last call, once ``wait_for`` of ``kind`` are there.

        A call's tool events are written just after its ``model_call``: once the awaited events are
        there, the sink is waited on until no write is in progress, so they are all there too.
        """
        deadline = time.monotonic() + timeout
        while True:
            evs = self.events()[self._seen :]
            got = [e.payload for e in evs if kind is None or e.kind == kind]
            if len(got) >= wait_for or time.monotonic() > deadline:
                self.sink.wait_idle(max(0.0, deadline - time.monotonic()) + 1.0)
                evs = self.events()[self._seen :]
                self._seen += len(evs)
                return [e.payload for e in evs]
            time.sleep(0.01)
