"""Workspace changes and watched-path opens, from inotify (through ctypes: stdlib only).

A file is reported when it is closed after writing, with the content it held then; renames pair
``IN_MOVED_FROM``/``IN_MOVED_TO`` by cookie, and scans make up for what inotify cannot promise
(docs/containers.md). Names are sent as the bytes they are, and nothing an agent names can stop the
watcher: an event it cannot handle becomes a note saying so, and the watcher goes on.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import hashlib
import os
import select
import stat
import struct
import threading
import time
from collections.abc import Callable, Sequence

from recorder.shim.wire import Access, Delete, NoteMsg, Rename, Write, describe

IN_MODIFY = 0x2
IN_CLOSE_WRITE = 0x8
IN_OPEN = 0x20
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ISDIR = 0x40000000
IN_DONT_FOLLOW = 0x02000000
IN_EXCL_UNLINK = 0x04000000
IN_CLOEXEC = 0o2000000
IN_NONBLOCK = 0o4000

WORKSPACE_MASK = (
    IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DONT_FOLLOW | IN_EXCL_UNLINK
)
WATCHED_MASK = IN_OPEN | IN_MODIFY | IN_DONT_FOLLOW
_EVENT = struct.Struct("iIII")

Emit = Callable[[object], None]


class _Inotify:
    def __init__(self) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        self._add = libc.inotify_add_watch
        self._add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self.fd = libc.inotify_init1(IN_CLOEXEC | IN_NONBLOCK)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        # poll, not select: select refuses a descriptor numbered past 1,023 (a process holding many
        # open files, such as the local backend's recorder, hands out such numbers).
        self._poller = select.poll()
        self._poller.register(self.fd, select.POLLIN)

    def add(self, path: str, mask: int) -> int:
        wd = self._add(self.fd, os.fsencode(path), mask)
        if wd < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e), path)
        return wd

    def read(self, timeout: float) -> list[tuple[int, int, int, str]]:
        if not self._poller.poll(max(0.0, timeout) * 1000):
            return []
        try:
            buf = os.read(self.fd, 1 << 20)
        except BlockingIOError:
            return []
        events = []
        i = 0
        while i + _EVENT.size <= len(buf):
            wd, mask, cookie, length = _EVENT.unpack_from(buf, i)
            i += _EVENT.size
            name = buf[i : i + length].rstrip(b"\0").decode("utf-8", "surrogateescape")
            i += length
            events.append((wd, mask, cookie, name))
        return events

    def close(self) -> None:
        os.close(self.fd)


class Watcher:
    """Watches a workspace (recursively) and some extra paths; emits wire messages via ``emit``."""

    def __init__(
        self,
        workspace: str,
        emit: Emit,
        *,
        content_cap: int,
        watched: Sequence[str] = (),
        absolute: bool = False,
    ):
        self.root = os.path.realpath(workspace)
        self.absolute = absolute
        """Report absolute paths (a directory outside the workspace, e.g. /tmp) instead of relative."""
        self.emit = emit
        self.cap = content_cap
        self.ino = _Inotify()
        self.dirs: dict[int, str] = {}
        """wd -> directory path relative to the workspace ('' is the root)."""
        self.watched: dict[int, str] = {}
        """wd -> absolute watched path (forbidden reads)."""
        self.known: dict[str, tuple[int, int, str]] = {}
        """relative path -> (size, mtime_ns, sha256) as last reported (or found at start)."""
        self.seen_access: set[tuple[str, str]] = set()
        names = ("written", "deleted", "renamed", "accessed", "overflows", "rescans", "watch_errors")
        self.counts = dict.fromkeys(names, 0)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pending_move: tuple[int, str, bool, float] | None = None
        self._arrivals: dict[str, tuple[int, int, str]] = {}
        """Files the scan of a newly watched directory found, since the queue was last empty (each
        as in ``known``): one may be where a file whose move inotify could not pair went."""
        self._unread: set[str] = set()
        """Paths closed after writing that were gone when their close was handled: a rename that
        follows in the queue says where the file went (same inode, so the same content)."""
        self._lock = threading.Lock()
        self._add_tree("", initial=True)
        for path in watched:
            self._watch_extra(path)

    def _shown(self, rel: str) -> bytes:
        """A path as it is sent: its bytes, relative to the workspace (absolute when ``absolute``)."""
        return os.fsencode(os.path.join(self.root, rel) if self.absolute else rel)

    def _abs(self, rel: str) -> str:
        return os.path.join(self.root, rel) if rel else self.root

    def _add_dir(self, rel: str) -> bool:
        try:
            wd = self.ino.add(self._abs(rel), WORKSPACE_MASK)
        except OSError:
            return False
        self.dirs[wd] = rel
        return True

    def _add_tree(self, rel: str, *, initial: bool = False) -> None:
        """Watch ``rel`` and everything under it; report files found there (unless initial)."""
        if not self._add_dir(rel):
            return
        try:
            entries = list(os.scandir(self._abs(rel)))
        except OSError:
            return
        for entry in entries:
            child = f"{rel}/{entry.name}" if rel else entry.name
            try:
                if entry.is_dir(follow_symlinks=False):
                    self._add_tree(child, initial=initial)
                elif entry.is_file(follow_symlinks=False):
                    if initial:
                        st = entry.stat(follow_symlinks=False)
                        # Outside the workspace (a shared /tmp) the first write is reported
                        # whatever it holds: hashing everything already there could take long.
                        digest = "" if self.absolute else _hash_path(entry.path)[1]
                        self.known[child] = (st.st_size, st.st_mtime_ns, digest)
                    else:
                        self._report_file(child)
                        if child in self.known:
                            self._arrivals[child] = self.known[child]
            except OSError:
                continue

    def _watch_extra(self, path: str) -> None:
        targets = [path]
        if os.path.isdir(path):
            for dirpath, dirnames, _ in os.walk(path):
                targets += [os.path.join(dirpath, d) for d in dirnames]
        for t in targets:
            try:
                self.watched[self.ino.add(t, WATCHED_MASK)] = t
            except OSError:
                continue  # absent or unreadable: nothing to see there

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="amb-shim-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll(0.05)
            except Exception as e:  # noqa: BLE001 - the watcher must outlive whatever went wrong
                self._failed("inotify's queue", e)
                time.sleep(0.05)

    def poll(self, timeout: float) -> int:
        """Read and handle one batch of events; returns how many there were."""
        events = self.ino.read(timeout)
        with self._lock:
            for ev in events:
                try:
                    self._handle(*ev)
                except Exception as e:  # noqa: BLE001 - one fact lost must not lose the ones after it
                    self._failed(self.dirs.get(ev[0], self.watched.get(ev[0], "?")), e, ev[3])
            if self._pending_move is not None and (
                not events or time.monotonic() - self._pending_move[3] > 0.05
            ):
                self._flush_move()
            if not events:  # the queue is empty: a move into a new directory has been paired by now
                self._arrivals.clear()
        return len(events)

    def _handle(self, wd: int, mask: int, cookie: int, name: str) -> None:
        if mask & IN_Q_OVERFLOW:
            self.counts["overflows"] += 1
            self.emit(
                NoteMsg(text="shim: inotify queue overflowed; rescanning the workspace", ts_ns=time.time_ns())
            )
            self.rescan()
            return
        if wd in self.watched:
            self._access(wd, mask, name)
            return
        base = self.dirs.get(wd)
        if base is None:
            return
        if mask & IN_IGNORED:
            self.dirs.pop(wd, None)
            return
        rel = f"{base}/{name}" if base else name
        if not name:
            return
        if self._pending_move is not None and not (mask & IN_MOVED_TO and cookie == self._pending_move[0]):
            self._flush_move()
        isdir = bool(mask & IN_ISDIR)
        if mask & IN_CREATE:
            if isdir:
                self._add_tree(rel)
            return
        if mask & IN_CLOSE_WRITE:
            self._report_file(rel)
        elif mask & IN_DELETE:
            if not isdir:
                self._deleted(rel)
        elif mask & IN_MOVED_FROM:
            self._pending_move = (cookie, rel, isdir, time.monotonic())
        elif mask & IN_MOVED_TO:
            if self._pending_move is not None and self._pending_move[0] == cookie:
                _, src, _, _ = self._pending_move
                self._pending_move = None
                self._renamed(src, rel, isdir)
            elif isdir:
                self._add_tree(rel)  # moved in from outside the workspace
            else:
                self._report_file(rel)

    def _failed(self, where: str, error: Exception, name: str = "") -> None:
        """Something could not be recorded: that is a fact too (a note naming where and why)."""
        self.counts["watch_errors"] += 1
        names = {"where": os.fsencode(where)}
        if name:
            names["name"] = os.fsencode(name)
        text = "shim: a workspace change could not be recorded"
        # not even the note goes out: the count in the shim's bye says so
        with contextlib.suppress(Exception):
            self.emit(NoteMsg(text=text, data={"error": describe(error)}, names=names, ts_ns=time.time_ns()))

    def _flush_move(self) -> None:
        """A MOVED_FROM with no MOVED_TO: the thing left the workspace, i.e. it is gone."""
        assert self._pending_move is not None
        _, src, isdir, _ = self._pending_move
        self._pending_move = None
        if isdir:
            for path in [p for p in self.known if p.startswith(src + "/")]:
                self._deleted(path)
            return
        # Moved into a directory made since the last batch, before its watch existed: inotify sent
        # no MOVED_TO, but the scan of that directory found the file (a rename keeps size, mtime and
        # content). Reported as the rename it was; the file's arrival was reported by the scan.
        entry = self.known.get(src)
        dst = next((p for p, e in self._arrivals.items() if e == entry and p != src), None)
        if entry is None or dst is None or os.path.lexists(self._abs(src)):
            self._deleted(src)
            return
        del self._arrivals[dst]
        self._unread.discard(src)
        self.known.pop(src)
        self._emit_rename(src, dst)

    def _report_file(self, rel: str, *, read_at: str | None = None) -> None:
        """Report ``rel`` as written, with what the file holds now (read at ``read_at`` if given: the
        path it was renamed to before its close could be handled)."""
        path = self._abs(read_at if read_at is not None else rel)
        try:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode):
                return
            data, digest = _hash_path(path, self.cap)
        except OSError:
            self._unread.add(rel)
            return  # gone already: its deletion (or rename) follows
        self._unread.discard(rel)
        old = self.known.get(rel)
        if old is not None and old[2] == digest:
            self.known[rel] = (st.st_size, st.st_mtime_ns, digest)
            return
        size = len(data) if data is not None else st.st_size
        self.known[rel] = (size, st.st_mtime_ns, digest)
        self.counts["written"] += 1
        now = time.time_ns()
        self.emit(
            Write(
                path=self._shown(rel),
                op="modified" if old is not None else "created",
                size=size,
                sha256=digest,
                content=data,
                ts_ns=now,
                changed_ns=min(st.st_ctime_ns, now),
            )
        )

    def _deleted(self, rel: str) -> None:
        self._unread.discard(rel)
        if self.known.pop(rel, None) is None and not self.absolute:
            # Outside the workspace a file made and deleted before it was read is still a fact: its
            # deletion is reported (inside, the workspace's final state is what matters).
            return
        self.counts["deleted"] += 1
        now = time.time_ns()
        changed = _ctime(os.path.dirname(self._abs(rel)), now)
        self.emit(Delete(path=self._shown(rel), ts_ns=now, changed_ns=changed))

    def _emit_rename(self, src: str, dst: str) -> None:
        self.counts["renamed"] += 1
        now = time.time_ns()
        changed = _ctime(self._abs(dst), now)
        self.emit(Rename(src=self._shown(src), dst=self._shown(dst), ts_ns=now, changed_ns=changed))

    def _renamed(self, src: str, dst: str, isdir: bool) -> None:
        if isdir:
            for wd, rel in list(self.dirs.items()):
                if rel == src or rel.startswith(src + "/"):
                    self.dirs[wd] = dst + rel[len(src) :]
            moved = [p for p in self.known if p.startswith(src + "/")]
            for p in moved:
                self.known[dst + p[len(src) :]] = self.known.pop(p)
            self._emit_rename(src, dst)
            return
        if src in self._unread:
            # Written, closed and renamed before the close was handled (the watcher lagged): the
            # write happened under the old name, so it is reported there, read through the new one.
            self._report_file(src, read_at=dst)
        entry = self.known.pop(src, None)
        if dst in self.known:
            # Overwriting rename: the old dst is replaced; no separate deletion is reported.
            self.known.pop(dst)
        if entry is None:
            self._report_file(dst)  # src was never seen (made and renamed within one batch)
            return
        self.known[dst] = entry
        self._emit_rename(src, dst)
        with contextlib.suppress(OSError):  # a rename of a file still being written: its content now
            st = os.lstat(self._abs(dst))
            if (st.st_size, st.st_mtime_ns) != entry[:2]:
                self._report_file(dst)

    def _access(self, wd: int, mask: int, name: str) -> None:
        base = self.watched[wd]
        path = os.path.join(base, name) if name else base
        mode = "w" if mask & IN_MODIFY else "r"
        if (path, mode) in self.seen_access:
            return
        self.seen_access.add((path, mode))
        self.counts["accessed"] += 1
        self.emit(Access(path=os.fsencode(path), mode=mode, ts_ns=time.time_ns()))

    def rescan(self) -> None:
        """Compare the workspace with what was reported; report the differences."""
        self.counts["rescans"] += 1
        present: set[str] = set()
        for dirpath, _dirnames, filenames in os.walk(self.root):
            reldir = os.path.relpath(dirpath, self.root)
            reldir = "" if reldir == "." else reldir
            if reldir not in self.dirs.values():
                self._add_dir(reldir)
            for name in filenames:
                rel = f"{reldir}/{name}" if reldir else name
                path = os.path.join(dirpath, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                present.add(rel)
                old = self.known.get(rel)
                if old is None or old[:2] != (st.st_size, st.st_mtime_ns):
                    try:
                        self._report_file(rel)
                    except Exception as e:  # noqa: BLE001 - as in poll: the scan goes on
                        self._failed(reldir, e, name)
        for rel in [p for p in self.known if p not in present]:
            self._deleted(rel)

    def finish(self) -> None:
        """Stop the loop, drain what is queued, and reconcile against the disk."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        while self.poll(0.0):
            pass
        with self._lock:
            if self._pending_move is not None:
                self._flush_move()
            self.rescan()
        self.ino.close()


def _ctime(path: str, now: int) -> int | None:
    """When the kernel last changed ``path``'s inode (no process can set a ctime back), at most now.

    The shim observes a change some time after it happened (its thread must be scheduled); the
    ctime says when it happened: for a rename the moved file's, for a deletion its directory's
    (a later change in that directory moves it later, never earlier than the deletion)."""
    try:
        return min(os.lstat(path).st_ctime_ns, now)
    except OSError:
        return None


def _hash_path(path: str, cap: int = 1 << 62) -> tuple[bytes | None, str]:
    """(content if size <= cap else None, sha256) of one file, read once."""
    h = hashlib.sha256()
    chunks: list[bytes] | None = []
    total = 0
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            h.update(chunk)
            total += len(chunk)
            if chunks is not None:
                if total > cap:
                    chunks = None
                else:
                    chunks.append(chunk)
    finally:
        os.close(fd)
    return (b"".join(chunks) if chunks is not None else None), "sha256:" + h.hexdigest()
