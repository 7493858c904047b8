"""``amb serve``: the viewer's HTTP server (on the project's HTTP layer, ``schemas.httpbase``).

GET only. ``/api/...`` answers from the route table (``replay.web.routes``); every other path is
one of the pages, which are the same static HTML shell (the script routes on the path). Everything
an agent wrote is hostile: the pages put it into the DOM as text only, the HTML carries a
Content-Security-Policy that allows no inline script and nothing from elsewhere, blobs are served
as plain text or as images whose type was sniffed from their bytes (never as HTML), and a Host
header that is not the address the server listens on is refused (a web page cannot reach the
viewer by DNS rebinding).
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

import duckdb
import msgspec

from replay.store import _require
from replay.web import diff as diffs
from replay.web import routes, runs
from replay.web.db import SharedReader
from replay.web.resource import BLOB_CSP, BadRequest, Body, NotFound
from schemas import httpbase
from schemas.blobstore import BlobStore
from schemas.errors import AmbError, StoreError
from schemas.errors import NotFound as StoreMissing

T = TypeVar("T")
STATIC = {"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"}


def _digest(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def build_page() -> tuple[bytes, str]:
    """The pages' one HTML shell with its script and style inside it (a deep link's first paint then
    waits for one round trip less), and the Content-Security-Policy that lets exactly those two run
    (by their hashes) and nothing else inline."""
    static = resources.files("replay.web") / "static"
    html = (static / "index.html").read_text()
    css, js = (static / "app.css").read_text(), (static / "app.js").read_text()
    for text, closing in ((css, "</style"), (js, "</script")):
        if closing in text.lower():  # would end the element early: refuse to build a broken page
            raise AmbError(f"the viewer's static files contain {closing!r}: cannot inline them")
    style_tag, script_tag = (
        '<link rel="stylesheet" href="/static/app.css">',
        '<script src="/static/app.js"></script>',
    )
    if style_tag not in html or script_tag not in html:
        raise AmbError("the viewer's index.html no longer links app.css and app.js as expected")
    html = html.replace(style_tag, f"<style>{css}</style>").replace(script_tag, f"<script>{js}</script>")
    csp = (
        f"default-src 'none'; script-src {_digest(js)}; style-src {_digest(css)}; img-src 'self'; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
    return html.encode(), csp


class Viewer:
    """The state shared by request threads: the store, its reader, the run index, kept answers
    (diffs and verifications)."""

    def __init__(self, store: Path, idle_s: float = 2.0):
        _require(store)
        self.root = store
        self.reader = SharedReader(store, idle_s=idle_s)
        self.blobs = BlobStore(store / "blobs")
        self._index: runs.RunIndex | None = None
        self._index_lock = threading.Lock()
        self._kept_answers: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        self._lock = threading.Lock()
        self.static = {
            name: (resources.files("replay.web") / "static" / name).read_bytes() for name in STATIC
        }
        self.page, self.page_csp = build_page()

    def index(self) -> runs.RunIndex:
        """The run index as of the store's current state (built again when a writer changed it)."""
        generation = self.reader.generation()
        with self._index_lock:
            if self._index is None or self._index.generation != generation:
                self._index = self.reader.scan(lambda con: runs.build_run_index(con, generation))
            return self._index

    def prepare(self) -> None:
        """A page was just asked for: the run index (or, if current, a connection) its API calls will
        need is made now, in the background, while the browser parses the page."""
        if self._index_lock.locked():
            return  # being built
        try:
            current = self._index is not None and self._index.generation == self.reader.generation()
        except OSError:
            return  # the request that follows reports why the store cannot be read
        if current:
            self.reader.warm()
            return

        def build() -> None:
            try:
                self.index()
            except (AmbError, duckdb.Error, OSError):
                pass  # the request that follows builds it again and reports why it cannot

        threading.Thread(target=build, name="amb-serve-index", daemon=True).start()

    def _kept(self, key: tuple[Any, ...], make: Callable[[], T]) -> T:
        """``make()``, computed once per key and kept (the last 16 keys)."""
        with self._lock:
            hit: T | None = self._kept_answers.get(key)
        if hit is None:
            hit = make()
            with self._lock:
                self._kept_answers[key] = hit
                while len(self._kept_answers) > 16:
                    self._kept_answers.popitem(last=False)
        return hit

    def diff(self, q: routes.DiffQuery) -> diffs.DiffPage:
        index = self.index()
        a, b = index.row(q.a), index.row(q.b)

        def compare() -> diffs.Compared:
            with self.reader.cursor() as con:
                return diffs.compare(con, a, b)

        compared = self._kept(("diff", a.run_id, b.run_id, index.generation), compare)
        return diffs.page(compared, a, b, q.limit, q.cursor, q.at == "first")

    def verified(self, con: Any, run_id: str, generation: tuple[int, int, int]) -> runs.Verified:
        """``amb verify RUN`` re-reads every blob of the run: done once per run and store state."""
        return self._kept(("verify", run_id, generation), lambda: runs.run_verify(con, self.blobs, run_id))

    def close(self) -> None:
        self.reader.close()


def json_body(reply: Any) -> bytes:
    """An answer as JSON in UTF-8; with a lone surrogate (which an agent can send escaped in its
    JSON, and UTF-8 cannot carry), as ASCII JSON that escapes it again."""
    try:
        return msgspec.json.encode(reply, enc_hook=str)
    except UnicodeEncodeError:
        return json.dumps(msgspec.to_builtins(reply, enc_hook=str)).encode()


class Handler(httpbase.Handler):
    server_version = "amb-serve"
    # Keep-alive: the page's static files and API calls reuse a connection (and its thread) instead
    # of opening one per request; an idle connection is closed after `timeout` seconds.
    timeout = 30
    always = {
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-store",
    }
    viewer: Viewer

    def do_HEAD(self) -> None:
        self.do_GET()

    def _refuse(self, status: int, why: str) -> None:
        self.send(status, msgspec.json.encode(self.error_json(status, why)), "application/json")

    def error_json(self, status: int, message: str) -> Any:
        return {"error": message}  # (the shape of the viewer's own refusals)

    def do_POST(self) -> None:
        self._refuse(405, "the viewer is read-only: GET only")

    do_PUT = do_DELETE = do_PATCH = do_POST

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        parts = [unquote(s) for s in url.path.split("/") if s]
        try:
            if parts and parts[0] == "api":
                self._answer(routes.answer(self.viewer, parts[1:], dict(parse_qsl(url.query, True))))
            elif parts[:1] == ["static"] and len(parts) == 2 and parts[1] in STATIC:
                self.send(200, self.viewer.static[parts[1]], STATIC[parts[1]])
            elif parts == ["favicon.ico"]:
                self.send(204, b"", "image/x-icon")
            elif not parts or parts[0] in ("runs", "diff", "grid"):
                self.viewer.prepare()
                csp = {"Content-Security-Policy": self.viewer.page_csp}
                self.send(200, self.viewer.page, "text/html; charset=utf-8", csp)
            else:
                self._refuse(404, "no such page")
        except NotFound as e:
            self._refuse(404, str(e))
        except BadRequest as e:
            self._refuse(400, str(e))
        except (StoreError, StoreMissing) as e:
            self._refuse(503, f"the store is busy or unreadable: {e}")
        except AmbError as e:
            self._refuse(500, str(e))
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as e:  # (a fault of the viewer's: answered, not a dropped connection)
            self._refuse(500, f"the viewer failed on this request: {type(e).__name__}: {e}")

    def _answer(self, reply: Any) -> None:
        if isinstance(reply, Body):
            self.send(
                200, reply.data, reply.media_type, {"Content-Security-Policy": BLOB_CSP, **reply.headers}
            )
        else:
            self.send(200, json_body(reply), "application/json; charset=utf-8")


class Running(httpbase.Serving):
    """The viewer: ``serve_forever()`` in the foreground (``amb serve``), or on a thread as a context
    manager (tests, benchmarks, ``amb report``'s links)."""

    def __init__(self, store: Path, host: str = "127.0.0.1", port: int = 0, idle_s: float = 2.0):
        self.viewer = Viewer(store, idle_s=idle_s)
        names = httpbase.answered_names(host)  # (no DNS rebinding)
        try:
            super().__init__(Handler, host, port, 0.5, viewer=self.viewer, allowed_hosts=names)
        except BaseException:
            self.viewer.close()
            raise

    def stop(self) -> None:
        super().stop()
        self.viewer.close()
