"""``amb serve``: the viewer's HTTP server (standard library ``ThreadingHTTPServer``).

GET only. ``/api/...`` answers JSON (``replay.web.api``); every other path is one of the pages,
which are the same static HTML shell (the script routes on the path). Everything an agent wrote is
hostile: the pages put it into the DOM as text only, the HTML carries a Content-Security-Policy
that allows no inline script and nothing from elsewhere, blobs are served as plain text or as
images whose type was sniffed from their bytes (never as HTML), and a Host header that is not the
address the server listens on is refused (a web page cannot reach the viewer by DNS rebinding).
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import threading
import time
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from replay.store import _require
from replay.web import api, workspace
from replay.web import diff as diffs
from replay.web.db import SharedReader
from schemas.blobstore import BlobStore
from schemas.errors import AmbError, StoreError
from schemas.errors import NotFound as StoreMissing

STATIC = {"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"}


def _digest(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def build_page() -> tuple[bytes, str]:
    """The pages' one HTML shell with its script and style inside it, and the Content-Security-Policy
    that lets exactly those two run (by their hashes) and nothing else inline.

    Inside the page, a deep link's first paint waits for one request less: the browser asks for the
    events as soon as the page is parsed instead of after fetching app.js and app.css (one more round
    trip on a busy machine). The files stay under /static/ too."""
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


BLOB_CSP = "default-src 'none'; sandbox"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Viewer:
    """The state shared by request threads: the store, its reader, the run index, cached diffs."""

    def __init__(self, store: Path, idle_s: float = 2.0):
        _require(store)
        self.root = store
        self.reader = SharedReader(store, idle_s=idle_s)
        self.blobs = BlobStore(store / "blobs")
        self.index_cache = api.RunIndexCache(self._build_index)
        self._diffs: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        self._diff_lock = threading.Lock()
        self._verified: dict[tuple[str, tuple[int, int, int]], dict[str, Any]] = {}
        self.static = {
            name: (resources.files("replay.web") / "static" / name).read_bytes() for name in STATIC
        }
        self.page, self.page_csp = build_page()

    def _build_index(self) -> api.RunIndex:
        with self.reader.cursor() as con:
            return api.build_run_index(con, self.reader.generation())

    def index(self) -> api.RunIndex:
        return self.index_cache.get(self.reader.generation())

    def diff(self, a: str, b: str, params: dict[str, str]) -> dict[str, Any]:
        index = self.index()
        for r in (a, b):
            if r not in index.by_id:
                raise api.NotFound(f"no run {r!r} in the store")
        key = (a, b, index.generation)
        with self._diff_lock:
            cached = self._diffs.get(key)
        if cached is None:
            with self.reader.cursor() as con:
                sa, sb = diffs.load_steps(con, a), diffs.load_steps(con, b)
                rows = diffs.align(sa, sb)
                summary = diffs.summarize(rows, sa, sb)
                scores = {r: {p: s for p, s in index.by_id[r]["scores"].items()} for r in (a, b)}
                outcome = diffs.outcomes(
                    diffs.submission(con, a), diffs.submission(con, b), scores[a], scores[b]
                )
            cached = (rows, summary, outcome)
            with self._diff_lock:
                self._diffs[key] = cached
                while len(self._diffs) > 16:
                    self._diffs.popitem(last=False)
        rows, summary, outcome = cached
        limit = api._limit(params.get("limit"), 200)
        start = 0
        if params.get("cursor"):
            mark = api.decode_cursor(params["cursor"])
            if not isinstance(mark, int) or mark < 0:
                raise api.BadRequest("bad diff cursor")
            start = mark
        if params.get("at") == "first" and summary["first_divergence"] is not None:
            start = max(summary["first_divergence"]["row"] - 5, 0)
        page = rows[start : start + limit]
        for i, row in enumerate(page):
            row["row"] = start + i
        return {
            "a": api._run_row(index.by_id[a]),
            "b": api._run_row(index.by_id[b]),
            "summary": summary,
            "outcomes": outcome,
            "rows": page,
            "from_row": start,
            # A row number names the aligned pair: rows are computed once per pair of runs and kept.
            "next": api.encode_cursor(start + limit) if start + limit < len(rows) else None,
            "prev": api.encode_cursor(max(start - limit, 0)) if start > 0 else None,
            "total_rows": len(rows),
        }

    def verified(self, con: Any, run_id: str, generation: tuple[int, int, int]) -> dict[str, Any]:
        """``amb verify RUN`` re-reads every blob of the run: done once per run and store state."""
        key = (run_id, generation)
        with self._diff_lock:
            hit = self._verified.get(key)
        if hit is None:
            hit = api.run_verify(con, self.blobs, run_id)
            with self._diff_lock:
                self._verified[key] = hit
        return hit

    def close(self) -> None:
        self.reader.close()


def _host_name(header: str) -> str:
    """The host part of a Host header, lower case (``[::1]:8765`` → ``[::1]``)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header.split("]", 1)[0] + "]"
    return header.rsplit(":", 1)[0]


def _segments(path: str) -> list[str]:
    return [unquote(s) for s in path.split("/") if s]


class Handler(BaseHTTPRequestHandler):
    server_version = "amb-serve"
    # Headers and body go out in separate writes: without TCP_NODELAY the body waits for the
    # client's delayed ACK (~40 ms per response, measured on the page's static files).
    disable_nagle_algorithm = True
    # Keep-alive: the page's static files and API calls reuse a connection (and its thread) instead
    # of opening one per request; an idle connection is closed after `timeout` seconds.
    protocol_version = "HTTP/1.1"
    timeout = 30
    viewer: Viewer
    allowed_hosts: set[str]
    quiet = True

    def log_message(self, format: str, *args: Any) -> None:
        if not self.quiet:
            super().log_message(format, *args)

    def do_HEAD(self) -> None:
        self.do_GET()

    def _refuse(self, status: int, why: str) -> None:
        self._send(status, json.dumps({"error": why}).encode(), "application/json")

    def do_POST(self) -> None:
        self.close_connection = True  # its body is not read: the connection cannot carry another request
        self._refuse(405, "the viewer is read-only: GET only")

    do_PUT = do_DELETE = do_PATCH = do_POST

    def _send(self, status: int, body: bytes, ctype: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Cache-Control", "no-store")
        if self.close_connection:
            self.send_header("Connection", "close")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, data: Any, status: int = 200) -> None:
        body = json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str).encode()
        self._send(status, body, "application/json; charset=utf-8")

    def do_GET(self) -> None:
        if self.headers.get("Transfer-Encoding") or self.headers.get("Content-Length", "0") != "0":
            self.close_connection = True  # a body the viewer never reads: no further request on it
        if self.allowed_hosts and _host_name(self.headers.get("Host") or "") not in self.allowed_hosts:
            self._refuse(421, f"this server answers for {', '.join(sorted(self.allowed_hosts))} only")
            return
        url = urlsplit(self.path)
        params = dict(parse_qsl(url.query, keep_blank_values=True))
        parts = _segments(url.path)
        try:
            if parts and parts[0] == "api":
                self._api(parts[1:], params)
            elif parts[:1] == ["static"] and len(parts) == 2 and parts[1] in STATIC:
                self._send(200, self.viewer.static[parts[1]], STATIC[parts[1]])
            elif parts == ["favicon.ico"]:
                self._send(204, b"", "image/x-icon")
            elif not parts or parts[0] in ("runs", "diff", "grid"):
                self.viewer.reader.warm()
                self._send(
                    200,
                    self.viewer.page,
                    "text/html; charset=utf-8",
                    {"Content-Security-Policy": self.viewer.page_csp},
                )
            else:
                self._refuse(404, "no such page")
        except api.NotFound as e:
            self._refuse(404, str(e))
        except api.BadRequest as e:
            self._refuse(400, str(e))
        except (StoreError, StoreMissing) as e:
            self._refuse(503, f"the store is busy or unreadable: {e}")
        except AmbError as e:
            self._refuse(500, str(e))
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _api(self, parts: list[str], params: dict[str, str]) -> None:
        v = self.viewer
        if parts == ["runs"]:
            self._json(api.list_runs(v.index(), params))
        elif parts == ["diff"]:
            a, b = params.get("a"), params.get("b")
            if not a or not b:
                raise api.BadRequest("diff needs two runs: ?a=RUN&b=RUN")
            self._json(v.diff(a, b, params))
        elif parts == ["grid"]:
            if not params.get("task"):
                raise api.BadRequest("grid needs a task: ?task=ID")
            self._json(api.grid(v.index(), params["task"], params.get("profile") or None))
        elif len(parts) == 2 and parts[0] == "blobs":
            data = api.blob_bytes(v.blobs, parts[1])
            self._blob(data, parts[1], params.get("download") == "1")
        elif len(parts) >= 2 and parts[0] == "runs":
            self._run(parts[1], parts[2:], params)
        else:
            raise api.NotFound("no such API endpoint (see docs/viewer.md)")

    def _run(self, run_id: str, rest: list[str], params: dict[str, str]) -> None:
        v = self.viewer
        index = v.index()
        if run_id not in index.by_id:
            raise api.NotFound(f"no run {run_id!r} in the store")
        with v.reader.cursor() as con:
            if not rest:
                self._json(api.run_summary(con, index, run_id))
            elif rest == ["events"]:
                row = index.by_id[run_id]
                first_ns, last_ns = row["span_ns"]
                spacing = (last_ns - first_ns) / max(row["n_events"] - 1, 1)
                self._json(api.events_page(con, run_id, params, first_ns, spacing))
            elif len(rest) == 3 and rest[0] == "events" and rest[2].isdigit():
                self._json(api.event_detail(con, run_id, rest[1], int(rest[2])))
            elif len(rest) == 3 and rest[0] == "calls" and rest[2].isdigit():
                self._json(api.model_call(con, v.blobs, run_id, rest[1], int(rest[2])))
            elif (
                len(rest) == 5
                and rest[0] == "calls"
                and rest[3] == "images"
                and rest[2].isdigit()
                and rest[4].isdigit()
            ):
                data, media = api.call_image(con, v.blobs, run_id, rest[1], int(rest[2]), int(rest[4]))
                self._send(200, data, media, {"Content-Security-Policy": BLOB_CSP})
            elif rest == ["files"]:
                if not params.get("path"):
                    raise api.BadRequest("files needs ?path=PATH")
                seq = params.get("seq")
                if seq is not None and not seq.isdigit():
                    raise api.BadRequest("seq must be a whole number")
                self._json(api.file_versions(con, v.blobs, run_id, params["path"], int(seq) if seq else None))
            elif rest == ["files", "preview"]:
                seq = params.get("seq") or ""
                if not params.get("path") or not seq.isdigit():
                    raise api.BadRequest("a preview needs ?path=PATH&seq=N")
                png = api.file_preview(con, v.blobs, run_id, params["path"], int(seq))
                self._send(200, png, "image/png", {"Content-Security-Policy": BLOB_CSP})
            elif rest == ["workspace"]:
                self._json(workspace.files_at(con, run_id, params.get("at") or "end"))
            elif rest == ["workspace.tar"]:
                at = params.get("at") or "end"
                data, not_kept = workspace.tar_at(con, v.blobs, run_id, at)
                name = f"{run_id}-{at.replace(':', '-')}.tar"
                self._download(data, name, "application/x-tar", {"X-Amb-Not-Kept": str(not_kept)})
            elif rest == ["workspace", "file"]:
                if not params.get("path"):
                    raise api.BadRequest("a file needs ?path=PATH (and ?at=MOMENT)")
                data, _ = workspace.file_at(con, v.blobs, run_id, params.get("at") or "end", params["path"])
                self._download(data, params["path"].rsplit("/", 1)[-1], "application/octet-stream")
            elif rest == ["verify"]:
                self._json(v.verified(con, run_id, index.generation))
            elif rest == ["scores"]:
                self._json(api.run_scores(con, run_id))
            elif rest == ["timeline"]:
                self._json(api.timeline(con, run_id, params))
            else:
                raise api.NotFound("no such API endpoint (see docs/viewer.md)")

    def _download(self, data: bytes, name: str, ctype: str, headers: dict[str, str] | None = None) -> None:
        # The name came from the agent: only safe characters reach the header.
        safe = (
            "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in name)[:120] or "file"
        )
        self._send(
            200,
            data,
            ctype,
            {
                "Content-Disposition": f'attachment; filename="{safe}"',
                "Content-Security-Policy": BLOB_CSP,
                **(headers or {}),
            },
        )

    def _blob(self, data: bytes, sha: str, download: bool) -> None:
        media = None if download else api.sniff_image(data)
        if media is not None and len(data) <= api.IMAGE_CAP:
            self._send(200, data, media, {"Content-Security-Policy": BLOB_CSP})
            return
        if download:
            name = sha.replace(":", "-")
            self._send(
                200,
                data,
                "application/octet-stream",
                {
                    "Content-Disposition": f'attachment; filename="{name}"',
                    "Content-Security-Policy": BLOB_CSP,
                },
            )
            return
        self._send(
            200, data[: api.RAW_CAP], "text/plain; charset=utf-8", {"Content-Security-Policy": BLOB_CSP}
        )


def make_server(
    store: Path, host: str = "127.0.0.1", port: int = 0, idle_s: float = 2.0
) -> tuple[ThreadingHTTPServer, Viewer]:
    """A bound (not yet serving) server over ``store``; port 0 picks a free one."""
    viewer = Viewer(store, idle_s=idle_s)
    # Bound to loopback, only loopback names are answered (no DNS rebinding); a deliberate
    # non-loopback bind answers any name it is reached by.
    names = {host.lower(), "localhost", "127.0.0.1", "[::1]"} if is_loopback(host) else set()
    handler = type("ViewerHandler", (Handler,), {"viewer": viewer, "allowed_hosts": names})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server, viewer


class Running:
    """A viewer serving on a thread (for tests, benchmarks and ``amb report``'s links)."""

    def __init__(self, store: Path, host: str = "127.0.0.1", port: int = 0):
        self.host = host
        self.server, self.viewer = make_server(store, host, port)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.server.server_port}"

    def __enter__(self) -> Running:
        self.thread.start()
        time.sleep(0)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.viewer.close()
