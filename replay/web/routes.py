"""The viewer's API as a route table: each path under ``/api/`` → the resource that answers it,
with its query parameters as a Struct (docs/viewer.md's API section is generated from them)."""

from __future__ import annotations

import re
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import msgspec.inspect

from replay.web import calls, diff, events, files, runs, workspace
from replay.web.db import SharedReader
from replay.web.resource import IMAGE_CAP, RAW_CAP, Body, Limit, NotFound, Query, Route, Seq, parse_query
from schemas.blobstore import BlobStore


class Viewer(Protocol):
    """What the routes use of the server's shared state (``replay.web.server.Viewer``)."""

    blobs: BlobStore
    reader: SharedReader

    def index(self) -> runs.RunIndex: ...

    def diff(self, q: DiffQuery) -> diff.DiffPage: ...

    def verified(self, con: Any, run_id: str, generation: runs.Generation) -> runs.Verified: ...


@dataclass
class Ask:
    """One request, as its handler sees it: the viewer, the run index, the path's values, and a
    cursor on the store for a request about one run (the others are answered without one)."""

    viewer: Viewer
    index: runs.RunIndex
    args: dict[str, Any]
    con: Any
    """A ``duckdb.DuckDBPyConnection`` when the path names a run, else None."""

    @property
    def run(self) -> str:
        return str(self.args["run"])


class DiffQuery(Query, frozen=True):
    a: str
    b: str
    limit: Limit = 200
    cursor: str | None = None
    at: Literal["first"] | None = None


class BlobQuery(Query, frozen=True):
    download: Literal["0", "1"] = "0"


class FileQuery(Query, frozen=True):
    path: str
    seq: Seq | None = None


class PreviewQuery(Query, frozen=True):
    path: str
    seq: Seq


class MomentQuery(Query, frozen=True):
    at: str = "end"
    """A moment of the run: ``end``, ``step:N``, ``SOURCE:SEQ`` (the moments of ``amb files``)."""


class WorkspaceFileQuery(Query, frozen=True):
    path: str
    at: str = "end"


def download(data: bytes, name: str, media_type: str, headers: dict[str, str] | None = None) -> Body:
    # The name came from the agent: only safe characters reach the header.
    safe = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in name)[:120] or "file"
    disposition = {"Content-Disposition": f'attachment; filename="{safe}"'}
    return Body(data, media_type, {**disposition, **(headers or {})})


def blob(ask: Ask, q: BlobQuery) -> Body:
    """An image as itself, anything else as its first bytes in plain text, or all of it as a download."""
    sha = str(ask.args["sha"])
    data = files.blob_bytes(ask.viewer.blobs, sha)
    media = None if q.download == "1" else calls.sniff_image(data)
    if media is not None and len(data) <= IMAGE_CAP:
        return Body(data, media)
    if q.download == "1":
        return download(data, sha.replace(":", "-"), "application/octet-stream")
    return Body(data[:RAW_CAP], "text/plain; charset=utf-8")


def run_events(ask: Ask, q: events.EventsQuery) -> events.EventsPage:
    first_ns, last_ns = ask.index.spans[ask.run]
    spacing = (last_ns - first_ns) / max(ask.index.row(ask.run).n_events - 1, 1)
    return events.events_page(ask.con, ask.run, q, first_ns, spacing)


def call_image(ask: Ask, q: Query) -> Body:
    return Body(*calls.call_image(ask.con, ask.viewer.blobs, ask.run, **_key(ask), n=ask.args["n"]))


def preview(ask: Ask, q: PreviewQuery) -> Body:
    return Body(files.file_preview(ask.con, ask.viewer.blobs, ask.run, q.path, q.seq), "image/png")


def workspace_tar(ask: Ask, q: MomentQuery) -> Body:
    data, not_kept = workspace.tar_at(ask.con, ask.viewer.blobs, ask.run, q.at)
    name = f"{ask.run}-{q.at.replace(':', '-')}.tar"
    return download(data, name, "application/x-tar", {"X-Amb-Not-Kept": str(not_kept)})


def workspace_file(ask: Ask, q: WorkspaceFileQuery) -> Body:
    data, _ = workspace.file_at(ask.con, ask.viewer.blobs, ask.run, q.at, q.path)
    return download(data, q.path.rsplit("/", 1)[-1], "application/octet-stream")


ROUTES = [
    Route("runs", lambda ask, q: runs.list_runs(ask.index, q), runs.RunsPage, runs.RunsQuery),
    Route("diff", lambda ask, q: ask.viewer.diff(q), diff.DiffPage, DiffQuery),
    Route("grid", lambda ask, q: runs.grid(ask.index, q), runs.Grid, runs.GridQuery),
    Route("blobs/{sha}", blob, Body, BlobQuery),
    Route("runs/{run}", lambda a, q: runs.run_detail(a.con, a.index, a.run), runs.RunDetail),
    Route("runs/{run}/events", run_events, events.EventsPage, events.EventsQuery),
    Route(
        "runs/{run}/events/{source}/{seq:int}",
        lambda a, q: events.event_detail(a.con, a.run, **_key(a)),
        events.EventDetail,
    ),
    Route(
        "runs/{run}/calls/{source}/{seq:int}",
        lambda a, q: calls.model_call(a.con, a.viewer.blobs, a.run, **_key(a)),
        calls.CallDetail,
    ),
    Route("runs/{run}/calls/{source}/{seq:int}/images/{n:int}", call_image, Body),
    Route(
        "runs/{run}/files",
        lambda a, q: files.file_versions(a.con, a.viewer.blobs, a.run, q.path, q.seq),
        files.FileVersions,
        FileQuery,
    ),
    Route("runs/{run}/files/preview", preview, Body, PreviewQuery),
    Route(
        "runs/{run}/workspace",
        lambda a, q: workspace.files_at(a.con, a.run, q.at),
        workspace.WorkspaceFiles,
        MomentQuery,
    ),
    Route("runs/{run}/workspace.tar", workspace_tar, Body, MomentQuery),
    Route("runs/{run}/workspace/file", workspace_file, Body, WorkspaceFileQuery),
    Route(
        "runs/{run}/verify", lambda a, q: a.viewer.verified(a.con, a.run, a.index.generation), runs.Verified
    ),
    Route("runs/{run}/scores", lambda a, q: runs.run_scores(a.con, a.run), runs.RunScores),
    Route(
        "runs/{run}/timeline",
        lambda a, q: events.timeline(a.con, a.run, q, *a.index.spans[a.run]),
        events.Timeline,
        events.TimelineQuery,
    ),
]


def _key(ask: Ask) -> dict[str, Any]:
    return {"source": ask.args["source"], "seq": ask.args["seq"]}


def answer(viewer: Viewer, parts: list[str], params: dict[str, str]) -> Any:
    """The answer to ``/api/`` + ``parts``: the first route whose pattern matches."""
    for route in ROUTES:
        args = route.match(parts)
        if args is None:
            continue
        q = parse_query(params, route.query)
        index = viewer.index()
        if "run" in args:
            index.row(args["run"])  # an unknown run is a 404 before any query on it
        with viewer.reader.cursor() if "run" in args else nullcontext() as con:
            return route.handler(Ask(viewer, index, args, con), q)
    raise NotFound("no such API endpoint (see docs/viewer.md)")


def markdown() -> str:
    """The routes with their query parameters and answers, then every answer's fields (the tables of
    docs/viewer.md's ``api`` block)."""
    rows = ["| endpoint | query parameters: type, default | answer |", "|---|---|---|"]
    for route in ROUTES:
        path = re.sub(r"\{(\w+)(:int)?\}", lambda m: m[1].upper(), route.pattern)
        fields = msgspec.inspect.type_info(route.query).fields  # type: ignore[attr-defined]
        # (a parameter that may be null is one that may be left out)
        params = [f"`{f.name}` {_shape(f.type, []).removesuffix(' or null')}{_default(f)}" for f in fields]
        answer = "bytes" if route.answer is Body else f"`{route.answer.__name__}`"
        rows.append(f"| `GET /api/{path}` | {', '.join(params) or '–'} | {answer} |")
    rows += ["", "| answer | fields (`?`: left out when it does not apply) |", "|---|---|"]
    infos = msgspec.inspect.multi_type_info([r.answer for r in ROUTES if r.answer is not Body])
    seen: set[type] = set()
    todo = [t for t in infos if isinstance(t, msgspec.inspect.StructType)]
    while todo:
        struct = todo.pop(0)
        if struct.cls in seen:
            continue
        seen.add(struct.cls)
        shown = []
        omits = struct.cls.__struct_config__.omit_defaults
        for f in struct.fields:
            # (msgspec shows a field whose default is UNSET as having no default)
            optional = not f.required and (omits or f.default is f.default_factory is msgspec.NODEFAULT)
            shown.append(f"`{f.name}`{'?' if optional else ''} {_shape(f.type, todo)}")
        rows.append(f"| `{struct.cls.__name__}` | {', '.join(shown)} |")
    return "\n".join(rows)


def _shape(t: msgspec.inspect.Type, structs: list[msgspec.inspect.StructType]) -> str:
    """How a parameter or an answer's field looks; the Structs it names are added to ``structs``."""
    i = msgspec.inspect
    if isinstance(t, i.StructType):
        structs.append(t)
        return t.cls.__name__
    if isinstance(t, i.UnionType):
        return " or ".join(_shape(x, structs) for x in t.types)
    if isinstance(t, i.ListType):
        return f"[{_shape(t.item_type, structs)}]"
    if isinstance(t, i.TupleType):
        return "[" + ", ".join(_shape(x, structs) for x in t.item_types) + "]"
    if isinstance(t, i.DictType):
        return f"{{{_shape(t.key_type, structs)}: {_shape(t.value_type, structs)}}}"
    if isinstance(t, i.LiteralType):
        return " \\| ".join(f"`{v}`" for v in t.values)
    if isinstance(t, i.IntType) and t.ge is not None:
        return f"int {t.ge}–{t.le}" if t.le is not None else f"int ≥ {t.ge}"
    return type(t).__name__.removesuffix("Type").lower().replace("none", "null")


def _default(f: msgspec.inspect.Field) -> str:
    return " (required)" if f.required else "" if f.default in (None, "") else f" = `{f.default}`"
