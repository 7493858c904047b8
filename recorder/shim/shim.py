"""The shim's main loop: run the agent under a tracer, watch the workspace, stream facts out.

Inside a container the shim runs as root and the agent as an unprivileged uid (``--agent-uid``):
the agent then cannot signal, trace or read the shim, cannot connect to the receiver's socket
(mode 0600, owned by root), and so cannot forge, edit or suppress what the shim sends.

It fails closed: if the socket to the receiver breaks, the agent is killed, since anything it did
from then on would go unrecorded.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from recorder.shim import notify as nt
from recorder.shim import strace as st
from recorder.shim.oomwatch import OomWatch
from recorder.shim.procpoll import ProcPoller
from recorder.shim.watch import Watcher
from recorder.shim.wire import Bye, Hello, NoteMsg, encode_or_note

PRIVATE_PREFIX = "amb-shim-"
"""Name prefix of the shim's private directory when none is given (``--private-dir``)."""

DEFAULT_CAP = 8 * 1024 * 1024
"""Files up to this size are sent with their content; larger ones by hash only."""

TRACE_PAUSE = 0.05
"""Seconds the trace reader sleeps after a short read, so that strace's lines collect in the pipe (a
wakeup per line costs more CPU than parsing it); nothing is lost, strace waits when the pipe is full."""

TRACE_PIPE_SIZE = 1 << 20
"""Pipe buffer asked for the trace fifo (the default is 64 KiB): room for what strace writes while
the reader sleeps, so the agent is not held up waiting for the reader."""

DROP_CODE = (
    "import os,sys,ctypes\n"
    "u,g=int(sys.argv[1]),int(sys.argv[2]);a=sys.argv[3:]\n"
    "os.setgroups([]);os.setgid(g);os.setuid(u)\n"
    # After a uid change the process is not dumpable, so its tracer could not read the argv of the
    # exec that follows; the agent's processes are ordinary user processes, make this one so too.
    "ctypes.CDLL(None).prctl(4,1,0,0,0)\n"
    "try:\n os.execvp(a[0],a)\n"
    "except OSError as e:\n"
    " sys.stderr.write('amb-shim: cannot run %r: %s\\n'%(a[0],e.strerror));sys.exit(127)\n"
)


@dataclass
class Options:
    socket: str
    workspace: str
    argv: list[str]
    content_cap: int = DEFAULT_CAP
    watched: list[str] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)
    """Directories outside the workspace whose writes are recorded too, by absolute path (/tmp)."""
    tracer: str = "auto"
    """``auto`` (the first that works here of seccomp-notify, strace, proc-poll), or one of them."""
    agent_uid: int | None = None
    agent_gid: int | None = None
    linger: float = 2.0
    """Seconds background processes may outlive the agent's main process before they are killed."""
    private_dir: str | None = None
    """Where the shim keeps its own files (strace's fifo): a directory the agent cannot write to
    (the docker backend mounts a root-owned 0700 tmpfs at ``/run/amb/shim``). Nothing in the
    watched directories is skipped as the shim's own, so an agent cannot hide files under a name."""
    stop_on_oom: bool = False
    """Stop the agent at the first OOM kill in the shim's memory cgroup (``recorder.shim.oomwatch``):
    the docker backend's, where the shim shares the agent's memory limit."""


class Sender:
    """Thread-safe framed writes to the receiver; the first failure is remembered and reported."""

    def __init__(self, path: str, timeout: float = 10.0):
        deadline = time.monotonic() + timeout
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            try:
                s.connect(path)
                break
            except OSError as e:
                s.close()
                if time.monotonic() > deadline:
                    raise SystemExit(
                        f"amb-shim: cannot connect to the recorder at {path}: {e.strerror or e}"
                    ) from None
                time.sleep(0.05)
        self.sock = s
        self.lock = threading.Lock()
        self.broken: OSError | None = None
        self.on_broken = lambda: None
        self.sent = 0
        self.unsendable = 0
        """Messages that could not be encoded (each was replaced by a note saying so)."""

    def send(self, msg) -> None:
        self.send_many([msg])

    def send_many(self, msgs: list) -> None:
        """Send messages in one write (one wakeup of the receiver for the batch)."""
        if not msgs:
            return
        encoded = [encode_or_note(m) for m in msgs]
        frames = b"".join(frame for frame, _ in encoded)
        with self.lock:
            self.unsendable += sum(not ok for _, ok in encoded)
            if self.broken is not None:
                return
            try:
                self.sock.sendall(frames)
                self.sent += len(msgs)
            except OSError as e:
                self.broken = e
        if self.broken is not None:
            self.on_broken()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)
            self.sock.recv(1)  # the receiver closes once it has everything
        self.sock.close()


def run(opts: Options) -> int:
    # tempfile probes /tmp with a file of its own the first time it is used: do that before /tmp
    # is watched, so the shim's own probe is not reported as the agent's write.
    tempfile.gettempdir()
    sender = Sender(opts.socket)
    tracer, detail, seccomp = _choose_tracer(opts)
    if tracer is None:
        _say(sender, detail)
        return 125
    watcher = Watcher(opts.workspace, sender.send, content_cap=opts.content_cap, watched=opts.watched)
    outside = [
        Watcher(d, sender.send, content_cap=opts.content_cap, absolute=True)
        for d in opts.outside
        if os.path.isdir(d)
    ]
    sender.send(
        Hello(
            tracer=tracer,
            workspace=os.fsencode(opts.workspace),
            pid=os.getpid(),
            content_cap=opts.content_cap,
            watched=[os.fsencode(w) for w in opts.watched],
            detail=detail,
            ts_ns=time.time_ns(),
        )
    )
    if tracer == "proc-poll":
        sender.send(
            NoteMsg(
                text="shim: FALLBACK process observer proc-poll (ptrace not permitted): processes shorter "
                "than the poll interval may be missed and only the main process has an exit code",
                data={"detail": detail},
                ts_ns=time.time_ns(),
            )
        )
    watcher.start()
    for w in outside:
        w.start()

    argv = list(opts.argv)
    if opts.agent_uid is not None and tracer != nt.LABEL:  # (the notify launcher drops the uid itself)
        gid = opts.agent_gid if opts.agent_gid is not None else opts.agent_uid
        argv = [sys.executable, "-I", "-c", DROP_CODE, str(opts.agent_uid), str(gid), *argv]

    runner: _NotifyRun | _StraceRun | _PollRun
    if tracer == nt.LABEL:
        runner = _NotifyRun(opts, sender)
    elif tracer == "strace":
        runner = _StraceRun(opts, argv, sender, seccomp)
    else:
        runner = _PollRun(opts, argv, sender)
    sender.on_broken = runner.fail_closed
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: runner.forward(s))
    oom = _watch_oom(sender, runner) if opts.stop_on_oom else None
    code = runner.run()
    if oom is not None:
        oom.stop()

    watcher.finish()
    for w in outside:
        w.finish()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    counts = dict(watcher.counts)
    counts["written_outside"] = sum(w.counts["written"] for w in outside)
    counts.update(runner.counts)
    if oom is not None:
        counts["oom_kills"] = oom.kills
    counts["cpu_ms_shim"] = int((usage.ru_utime + usage.ru_stime) * 1000)
    counts["messages"] = sender.sent
    counts["unsendable"] = sender.unsendable
    sender.send(Bye(exit_code=code, counts=counts, ts_ns=time.time_ns()))
    sender.close()
    if sender.broken is not None:
        sys.stderr.write(f"amb-shim: lost the recorder ({sender.broken}); the agent was stopped\n")
        return 125
    return code


def _watch_oom(sender: Sender, runner: _NotifyRun | _StraceRun | _PollRun) -> OomWatch:
    """At the first OOM kill in the container, stop the agent (``recorder.shim.oomwatch`` says why)."""

    def stop() -> None:
        sender.send(
            NoteMsg(
                text="shim: the container ran out of memory and the kernel's OOM killer killed a process; "
                "the agent was stopped (the recorder shares that memory limit)",
                ts_ns=time.time_ns(),
            )
        )
        runner.fail_closed()

    watch = OomWatch(stop)
    if watch.path is None:
        sender.send(
            NoteMsg(text="shim: no memory cgroup counter here: OOM kills go unwatched", ts_ns=time.time_ns())
        )
    return watch.start()


def _choose_tracer(opts: Options) -> tuple[str | None, str, bool]:
    """(tracer, why the better ones were not taken, strace's --seccomp-bpf works); tracer None: the
    one asked for does not work here."""
    details = []
    if opts.tracer in ("auto", nt.LABEL):
        # The notify tracer reads SIGCHLD from a signalfd: block it before any thread exists.
        nt.block_sigchld()
        usable, detail = nt.probe(opts.agent_uid, opts.agent_gid)
        if usable:
            return nt.LABEL, "", True
        nt.unblock_sigchld()
        if opts.tracer == nt.LABEL:
            return None, detail, False
        details.append(detail)
    if opts.tracer in ("auto", "strace"):
        usable, seccomp, detail = st.probe()
        if usable:
            return "strace", "; ".join(details + [detail] if detail else details), seccomp
        if opts.tracer == "strace":
            return None, detail, False
        details.append(detail)
    return "proc-poll", "; ".join(details), False


class _NotifyRun:
    """Runs the agent under ``notify.NotifyTracer`` (see there)."""

    def __init__(self, opts: Options, sender: Sender):
        self.opts, self.sender = opts, sender
        self.tracer = nt.NotifyTracer(sender.send_many, agent_uid=opts.agent_uid, agent_gid=opts.agent_gid)
        self.counts: dict[str, int] = {}

    def run(self) -> int:
        try:
            self.tracer.start(list(self.opts.argv), self.opts.workspace)
        except OSError as e:
            _say(self.sender, str(e))
            self.tracer.stop()
            return 125
        while not self.tracer.root_done.wait(0.5):  # (a timed wait lets forwarded signals through)
            pass
        _wait_while(self.tracer.others_alive, self.opts.linger)
        killed = self.tracer.kill_all()
        _wait_while(self.tracer.others_alive, 5)  # their deaths, with the signal, are recorded
        self.tracer.stop()
        if self.tracer.failed:
            _say(self.sender, f"{self.tracer.failed}; the agent was stopped")
        self.counts.update(self.tracer.counts)
        self.counts["killed_lingerers"] = killed
        if self.tracer.last_error:
            _note_lost(self.sender, f"{self.tracer.counts['tracer_errors']} syscalls", self.tracer.last_error)
        status = self.tracer.root_status
        if status is None or self.tracer.failed:
            return 125
        return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)

    def forward(self, sig: int) -> None:
        if self.tracer.root_pid is not None and self.tracer.root_status is None:
            _kill([self.tracer.root_pid], sig)

    def fail_closed(self) -> None:
        self.tracer.kill_all()
        self.forward(signal.SIGKILL)


class _StraceRun:
    def __init__(self, opts: Options, argv: list[str], sender: Sender, seccomp: bool):
        self.opts, self.argv, self.sender, self.seccomp = opts, argv, sender, seccomp
        self.tracker = st.Tracker(root_cwd=os.path.realpath(opts.workspace), hide_marker=DROP_CODE)
        self.counts: dict[str, int] = {}
        self.proc: subprocess.Popen | None = None
        self._root_gone = threading.Event()

    def run(self) -> int:
        # 0700: only the shim's uid may open the fifo. Under the private dir, out of the agent's reach
        # and out of every watched directory.
        tmp = tempfile.mkdtemp(prefix=PRIVATE_PREFIX, dir=self.opts.private_dir)
        fifo = os.path.join(tmp, "trace")
        os.mkfifo(fifo, 0o600)
        reader = threading.Thread(target=self._read, args=(fifo,), name="amb-shim-strace", daemon=True)
        reader.start()
        # Started before the agent: a thread needs a pid, and the agent may take every one there is.
        reaper = threading.Thread(target=self._reap_lingerers, daemon=True)
        reaper.start()
        self.proc = subprocess.Popen(
            st.strace_command(fifo, self.argv, seccomp=self.seccomp), cwd=self.opts.workspace
        )
        self.proc.wait()
        # if strace never opened the fifo (it failed to start), unblock the reader
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(timeout=30)
        with contextlib.suppress(OSError):
            os.unlink(fifo)
            os.rmdir(tmp)
        if self.proc.returncode < 0:
            self.sender.send_many(self.tracker.root_killed(-self.proc.returncode, time.time_ns()))
        self.sender.send_many(self.tracker.unfinished(time.time_ns()))
        self.counts["unparsed_trace_lines"] = self.tracker.unparsed
        if self.tracker.last_error:
            _note_lost(self.sender, f"{self.tracker.unparsed} trace lines", self.tracker.last_error)
        if self.tracker.root_exit is not None:
            return self.tracker.root_exit
        rc = self.proc.returncode
        return 128 - rc if rc < 0 else rc

    def _read(self, fifo: str) -> None:
        fd = os.open(fifo, os.O_RDONLY | os.O_CLOEXEC)  # waits for strace to open it
        # above the system's pipe-max-size: the default buffer only means more waits
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, TRACE_PIPE_SIZE)
        try:
            while True:
                chunk = os.read(fd, TRACE_PIPE_SIZE)
                if not chunk:
                    break
                self._deliver(self.tracker.feed_bytes(chunk))
                if len(chunk) < TRACE_PIPE_SIZE // 4:  # a full pipe is read again at once
                    time.sleep(TRACE_PAUSE)
            self._deliver(self.tracker.flush())
        finally:
            os.close(fd)
        self._sample_cpu()

    def _deliver(self, msgs: list) -> None:
        self.sender.send_many(msgs)
        if self.tracker.root_exit is not None and not self._root_gone.is_set():
            self._sample_cpu()
            self._root_gone.set()

    def _sample_cpu(self) -> None:
        """strace's own CPU time (sampled: once it has exited, /proc no longer has it)."""
        if self.proc is not None:
            self.counts["cpu_ms_strace"] = max(self.counts.get("cpu_ms_strace", 0), _cpu_ms(self.proc.pid))

    def _reap_lingerers(self) -> None:
        """After the agent's main process ends, give its background children ``linger`` seconds."""
        while not self._root_gone.wait(0.2):
            if self.proc is not None and self.proc.poll() is not None:
                return
            self._sample_cpu()
        deadline = time.monotonic() + self.opts.linger
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                return
            self._sample_cpu()
            time.sleep(0.05)
        left = [pid for pid in list(self.tracker.procs) if pid != self.tracker.root_pid]
        _kill(left)
        self.counts["killed_lingerers"] = len(left)

    def forward(self, sig: int) -> None:
        if self.tracker.root_pid is not None:
            _kill([self.tracker.root_pid], sig)

    def fail_closed(self) -> None:
        _kill(list(self.tracker.procs))


class _PollRun:
    def __init__(self, opts: Options, argv: list[str], sender: Sender):
        self.opts, self.argv, self.sender = opts, argv, sender
        self.counts: dict[str, int] = {}
        self.proc: subprocess.Popen | None = None
        self.poller: ProcPoller | None = None

    def run(self) -> int:
        self.proc = subprocess.Popen(self.argv, cwd=self.opts.workspace)
        self.poller = ProcPoller(self.proc.pid, self.sender.send)
        self.poller.start()
        rc, root = self.proc.wait(), self.proc.pid
        poller = self.poller
        _wait_while(lambda: any(p != root for p in poller.alive), self.opts.linger)
        _kill([p for p in poller.alive if p != root])
        code = 128 - rc if rc < 0 else rc
        self.poller.finish(code if rc >= 0 else None, -rc if rc < 0 else None)
        return code

    def forward(self, sig: int) -> None:
        if self.proc is not None:
            with contextlib.suppress(OSError):
                self.proc.send_signal(sig)

    def fail_closed(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(OSError):
                self.proc.kill()


def _kill(pids: list[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def _wait_while(busy: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and busy():
        time.sleep(0.02)


def _say(sender: Sender, problem: str) -> None:
    """A problem of the shim's, in the record and on stderr."""
    sender.send(NoteMsg(text=f"shim: {problem}", ts_ns=time.time_ns()))
    sys.stderr.write(f"amb-shim: {problem}\n")


def _note_lost(sender: Sender, what: str, last_error: str) -> None:
    """A note that ``what`` (how many of something) could not be recorded, with the last reason."""
    sender.send(
        NoteMsg(text=f"shim: {what} could not be recorded; the last: {last_error}", ts_ns=time.time_ns())
    )


def _cpu_ms(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * 1000 // os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0
