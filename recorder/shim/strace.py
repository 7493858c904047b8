"""Process tracing with strace: the command line, and a parser that turns its output into facts.

strace runs the agent under ``-f --seccomp-bpf``, so only the syscalls named below stop the
tracee (everything else runs at full speed): exec, fork/clone (parentage and threads), chdir
(cwd), connect (network attempts). Exits come from strace's ``+++ exited/killed +++`` lines.

The parser is a small state machine over strace's text output: it joins ``<unfinished ...>`` /
``<... resumed>`` halves, keeps one record per process (threads fold into their process), and
emits a ``Proc`` when a process that exec'd something ends. A process that only forked (a shell
subshell) is not reported on its own: it ran no new program, and what it did shows through its
children and the workspace.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass, field

from recorder.shim import kernel
from recorder.shim.wire import Connect, Proc

TRACED = "execve,execveat,clone,clone3,fork,vfork,chdir,fchdir,connect"


def strace_command(output: str, argv: list[str], *, seccomp: bool = True) -> list[str]:
    filtered = ["--seccomp-bpf"] if seccomp else []
    options = ["-q", "-ttt", "-s", "65535", "-yy", "-e", f"trace={TRACED}", "-e", "signal=none", "-o", output]
    return [shutil.which("strace") or "strace", "-f", *filtered, *options, "--", *argv]


def probe() -> tuple[bool, bool, str]:
    """Can strace trace here? Returns (usable, seccomp_bpf_works, detail)."""
    if shutil.which("strace") is None:
        return False, False, "strace is not installed"
    for seccomp in (True, False):
        cmd = strace_command("/dev/null", ["true"], seccomp=seccomp)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired) as e:
            return False, False, f"strace did not run: {e}"
        if proc.returncode == 0:
            why = "" if seccomp else "--seccomp-bpf unavailable; tracing every stop of the traced syscalls"
            return True, seccomp, why
        detail = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
    return False, False, f"strace cannot trace here: {detail}"


_LINE = re.compile(r"^(\d+)\s+(\d+)\.(\d+) (.*)$")
_RESUMED = re.compile(r"^<\.\.\. (\w+) resumed>(.*)$")
_RESULT = re.compile(r"\)\s+=\s+(-?\d+|\?)(?:\s+(E[A-Z0-9]+))?")
_EXITED = re.compile(r"^\+\+\+ exited with (\d+) \+\+\+$")
_KILLED = re.compile(r"^\+\+\+ killed by (SIG\w+)(?: \(core dumped\))? \+\+\+$")
_ESCAPES = {"n": 10, "t": 9, "r": 13, "v": 11, "f": 12, "a": 7, "b": 8, "\\": 92, '"': 34, "'": 39}


def parse_string(text: str, i: int) -> tuple[str, int]:
    """Decode the C string literal starting at ``text[i] == '"'``; returns (value, index after)."""
    assert text[i] == '"'
    value, i = _unescape(text, i + 1, '"')
    if text.startswith("...", i):  # strace's mark for a string cut at -s
        i += 3
    return value, i


def _unescape(text: str, i: int, end: str) -> tuple[str, int]:
    """Decode strace's C escapes from ``text[i]`` up to the unescaped ``end`` (a string's closing
    quote, or the ``>`` after a ``-yy`` path); returns (value, index after ``end``). The value is
    the bytes strace printed, in Python's ``os.fsdecode`` form."""
    out = bytearray()
    n = len(text)
    while i < n:
        c = text[i]
        if c == end:
            return out.decode("utf-8", "surrogateescape"), i + 1
        if c == "\\" and i + 1 < n:
            e = text[i + 1]
            if e == "x":
                out.append(int(text[i + 2 : i + 4], 16))
                i += 4
                continue
            if e.isdigit():
                j = i + 1
                while j < n and j < i + 4 and text[j] in "01234567":
                    j += 1
                out.append(int(text[i + 1 : j], 8) & 0xFF)
                i = j
                continue
            out.append(_ESCAPES.get(e, ord(e)))
            i += 2
            continue
        out += c.encode("utf-8", "surrogateescape")
        i += 1
    raise ValueError("unterminated string")


def parse_string_array(text: str, i: int) -> tuple[list[str] | None, int]:
    """Decode ``["a", "b"...]`` at ``text[i]``; None when strace printed a bare address instead."""
    if text[i] != "[":
        return None, i
    i += 1
    items: list[str] = []
    while i < len(text):
        c = text[i]
        if c == '"':
            s, i = parse_string(text, i)
            items.append(s)
        elif c == "]":
            return items, i + 1
        else:
            i += 1
    raise ValueError("unterminated array")


@dataclass
class _Proc:
    pid: int
    ppid: int | None = None
    argv: list[bytes] | None = None
    cwd: bytes | None = None
    start_ns: int = 0
    execd: bool = False
    hidden: bool = False


@dataclass
class Tracker:
    """Folds strace lines into process records. Feed lines; collect ``Proc``/``Connect`` messages."""

    root_cwd: str
    hide_marker: str = ""
    """An argv element that marks the shim's own exec (the uid drop); such images are not reported."""
    procs: dict[int, _Proc] = field(default_factory=dict)
    threads: dict[int, int] = field(default_factory=dict)
    """Thread id -> its process (tgid)."""
    pending: dict[int, str] = field(default_factory=dict)
    """Per pid: the first half of an ``<unfinished ...>`` call."""
    held: dict[int, tuple[_Proc, int, int | None, int | None]] = field(default_factory=dict)
    """Processes that ended before the clone that made them returned in their parent (under load
    strace prints a parent's ``clone(... <unfinished ...>``, then the whole life of a quick child,
    then ``<... clone resumed> = child``): (process, end, exit code, signal), reported once that
    line says whose child each was, or when tracing stops."""
    root_pid: int | None = None
    root_exit: int | None = None
    unparsed: int = 0
    last_error: str | None = None
    """Why the last unparsed line could not be taken (other than being no syscall of interest)."""
    tail: bytes = b""
    """The incomplete last line of the chunks fed so far (see ``feed_bytes``)."""

    def feed_bytes(self, chunk: bytes) -> list:
        """Feed output as read from the pipe, in chunks that may end (or split a character) mid-line."""
        lines = (self.tail + chunk).split(b"\n")
        self.tail = lines.pop()
        out: list = []
        for line in lines:
            out += self.feed(line.decode("utf-8", "surrogateescape"))
        return out

    def flush(self) -> list:
        """The output ended: feed what is left of its last line."""
        tail, self.tail = self.tail, b""
        return self.feed(tail.decode("utf-8", "surrogateescape")) if tail else []

    def feed(self, line: str) -> list:
        m = _LINE.match(line.rstrip("\n"))
        if not m:
            return []
        tid = int(m.group(1))
        ts_ns = int(m.group(2)) * 1_000_000_000 + int(m.group(3).ljust(9, "0")[:9])
        rest = m.group(4)
        if self.root_pid is None:
            self.root_pid = tid
            self.procs[tid] = _Proc(tid, cwd=os.fsencode(self.root_cwd), start_ns=ts_ns)
        if rest.endswith("<unfinished ...>"):
            self.pending[tid] = rest[: -len("<unfinished ...>")].rstrip()
            return []
        r = _RESUMED.match(rest)
        if r:
            head = self.pending.pop(tid, None)
            if head is None:
                return []
            rest = head + r.group(2)
        try:
            return self._event(tid, ts_ns, rest)
        except Exception as e:  # noqa: BLE001 - a line the tracker cannot take must not end tracing
            self.unparsed += 1
            self.last_error = f"{type(e).__name__}: {e}"
            return []

    def _pid(self, tid: int) -> int:
        return self.threads.get(tid, tid)

    def _get(self, pid: int, ts_ns: int) -> _Proc:
        p = self.procs.get(pid)
        if p is None:
            p = self.procs[pid] = _Proc(pid, start_ns=ts_ns)
        return p

    def _ended(self, p: _Proc, end_ns: int, exit_code: int | None = None, sig: int | None = None) -> Proc:
        """The record of a program that ended at ``end_ns`` (no exit code: replaced by an exec, or
        still running when tracing stopped)."""
        return Proc(
            pid=p.pid,
            ppid=p.ppid,
            argv=p.argv or [],
            cwd=p.cwd,
            start_ns=p.start_ns,
            end_ns=end_ns,
            exit_code=exit_code,
            signal=sig,
        )

    def _event(self, tid: int, ts_ns: int, rest: str) -> list:
        if rest.startswith("+++"):
            return self._exit(tid, ts_ns, rest)
        name = rest[: rest.find("(")]
        res = _RESULT.search(rest)
        if res is None:
            return []
        value, errno = res.group(1), res.group(2)
        if name in ("execve", "execveat"):
            if value != "0":
                return []
            pid = self._pid(tid)
            if pid != tid:  # exec from a thread: the kernel gives the process the leader's id
                self.threads.pop(tid, None)
            p = self._get(pid, ts_ns)
            out = []
            if p.execd and not p.hidden:
                # The process replaces its program (a shell exec'ing its last command): the old
                # program is reported as ended there, with no exit code of its own.
                out.append(self._ended(p, ts_ns))
            arg_at = rest.index("(") + 1
            if name == "execveat":  # execveat(dirfd, "path", [argv], ...)
                arg_at = rest.index(", ", arg_at) + 2
            _path, j = parse_string(rest, arg_at) if rest[arg_at] == '"' else (None, rest.index(", ", arg_at))
            argv, _ = parse_string_array(rest, j + 2)
            # A process that had just changed uid cannot be read by its tracer until the exec
            # completes: its argv is taken from /proc instead.
            p.argv = [os.fsencode(a) for a in argv] if argv is not None else _read_cmdline(pid)
            p.execd = True
            p.start_ns = ts_ns
            # The shim's own privilege-dropping step is plumbing, not something the agent ran.
            p.hidden = bool(self.hide_marker) and os.fsencode(self.hide_marker) in (p.argv or [])
            if p.cwd is None:
                p.cwd = kernel.cwd(pid)
            return out
        if name in ("clone", "clone3", "fork", "vfork"):
            if value == "?" or int(value) <= 0:
                return []
            child = int(value)
            parent = self._get(self._pid(tid), ts_ns)
            if "CLONE_THREAD" in rest:
                self.threads[child] = parent.pid
                return []
            ended = self.held.pop(child, None)
            if ended is not None:
                done, end_ns, code, sig = ended
                done.ppid = parent.pid
                return [self._ended(done, end_ns, code, sig)]
            c = self._get(child, ts_ns)
            c.ppid = parent.pid
            if c.cwd is None:
                c.cwd = parent.cwd
            if c.argv is None:
                c.argv = parent.argv
            return []
        if name in ("chdir", "fchdir"):
            if value != "0":
                return []
            p = self._get(self._pid(tid), ts_ns)
            if name == "chdir":
                target, _ = parse_string(rest, rest.index("(") + 1)
                p.cwd = os.path.normpath(os.path.join(p.cwd or b"/", os.fsencode(target)))
            else:  # fchdir(3</the/dir>): -yy prints the path with C escapes (and '>' escaped)
                lt = rest.find("<")
                p.cwd = os.fsencode(_unescape(rest, lt + 1, ">")[0]) if lt > 0 else kernel.cwd(p.pid)
            return []
        if name == "connect":
            return self._connect(self._pid(tid), ts_ns, rest, value, errno)
        return []

    def _connect(self, pid: int, ts_ns: int, rest: str, value: str, errno: str | None) -> list:
        if "sa_family=AF_INET6" in rest:
            family = "inet6"
            host = re.search(r'inet_pton\(AF_INET6, "([^"]*)"', rest)
            port = re.search(r"sin6_port=htons\((\d+)\)", rest)
        elif "sa_family=AF_INET" in rest:
            family = "inet"
            host = re.search(r'inet_addr\("([^"]*)"\)', rest)
            port = re.search(r"sin_port=htons\((\d+)\)", rest)
        else:
            return []  # unix sockets (nscd, dbus) are local plumbing, not network attempts
        proto = "udp" if "<UDP" in rest else "tcp" if "<TCP" in rest else ""
        return [
            Connect(
                family=family + (f"/{proto}" if proto else ""),
                host=host.group(1) if host else "",
                port=int(port.group(1)) if port else None,
                error=errno if value != "0" else None,
                pid=pid,
                ts_ns=ts_ns,
            )
        ]

    def _exit(self, tid: int, ts_ns: int, rest: str) -> list:
        if tid in self.threads:
            self.threads.pop(tid)
            return []
        m = _EXITED.match(rest)
        k = _KILLED.match(rest)
        if not (m or k):
            return []  # "+++ superseded by execve +++" and the like
        code = int(m.group(1)) if m else None
        member = signal.Signals.__members__.get(k.group(1)) if k else None
        return self._end(tid, ts_ns, code, int(member) if member else None)

    def _end(self, tid: int, ts_ns: int, code: int | None, sig: int | None) -> list:
        p = self.procs.pop(tid, None)
        if tid == self.root_pid:
            self.root_exit = code if code is not None else 128 + (sig or 0)
        if p is None or not p.execd or p.hidden:
            return []
        if p.ppid is None and tid != self.root_pid:
            self.held[tid] = (p, ts_ns, code, sig)  # its parent's clone has not returned yet
            return []
        return [self._ended(p, ts_ns, code, sig)]

    def root_killed(self, sig: int, end_ns: int) -> list:
        """strace re-raises the signal that killed the traced command, and its last line (the
        ``+++ killed by +++``) can be lost with it: end the root process from strace's status."""
        if self.root_pid is None or self.root_exit is not None:
            return []
        return self._end(self.root_pid, end_ns, None, sig)

    def unfinished(self, end_ns: int) -> list:
        """Processes still alive when tracing stopped (reported with no exit code), and those ended
        whose parent's clone never returned (reported as they ended, parent unknown)."""
        out = [self._ended(p, end, code, sig) for p, end, code, sig in self.held.values()]
        out += [self._ended(p, end_ns) for p in self.procs.values() if p.execd and not p.hidden]
        self.procs.clear()
        self.held.clear()
        return out


def _read_cmdline(pid: int) -> list[bytes] | None:
    with contextlib.suppress(OSError):
        return kernel.read_cmdline(pid) or None
    return None
