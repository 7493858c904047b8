"""The strace output parser: joins split calls, folds threads, decodes C strings, ends processes."""

from __future__ import annotations

from recorder.shim import wire
from recorder.shim.strace import Tracker, parse_string, parse_string_array
from recorder.shim.wire import Connect, Proc


def feed(tracker: Tracker, text: str) -> list:
    out = []
    for line in text.strip().splitlines():
        out += tracker.feed(line.strip() + "\n")
    return out


def test_c_string_escapes() -> None:
    s, end = parse_string(r'"a\"b\\c\n\x41\303\251"...,', 0)
    assert s == 'a"b\\c\nAé' and end == len(r'"a\"b\\c\n\x41\303\251"...')
    arr, _ = parse_string_array(r'["sh", "-c", "echo \"hi\""]', 0)
    assert arr == ["sh", "-c", 'echo "hi"']
    assert parse_string_array("0x7ffc2174ba80, 0x1", 0)[0] is None


def test_unfinished_resumed_threads_and_exits() -> None:
    t = Tracker(root_cwd="/ws")
    out = feed(
        t,
        r"""
        10 1700000000.000001 execve("/bin/bash", ["bash", "-c", "x"], 0x7ffd /* 3 vars */) = 0
        10 1700000000.000010 chdir("sub") = 0
        10 1700000000.000020 clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|SIGCHLD <unfinished ...>
        11 1700000000.000030 execve("/bin/ls", ["ls", "-l"], 0x5 /* 3 vars */ <unfinished ...>
        10 1700000000.000040 <... clone resumed>, child_tidptr=0x7f) = 11
        11 1700000000.000050 <... execve resumed>) = 0
        11 1700000000.000060 clone3({flags=CLONE_VM|CLONE_FS|CLONE_THREAD|CLONE_SIGHAND, child_tid=0x7f}, 88) = 12
        12 1700000000.000070 connect(3<TCP:[1]>, {sa_family=AF_INET, sin_port=htons(443), sin_addr=inet_addr("1.2.3.4")}, 16) = -1 ENETUNREACH (Network is unreachable)
        12 1700000000.000080 +++ exited with 0 +++
        11 1700000000.000090 +++ killed by SIGKILL +++
        10 1700000000.000100 +++ exited with 2 +++
    """,  # noqa: E501 - verbatim strace lines; their length is the data
    )
    conns = [m for m in out if isinstance(m, Connect)]
    assert conns == [
        Connect(
            family="inet/tcp",
            host="1.2.3.4",
            port=443,
            error="ENETUNREACH",
            pid=11,
            ts_ns=1700000000000070000,
        )
    ]
    procs = [m for m in out if isinstance(m, Proc)]
    assert [(p.pid, p.ppid, p.argv, p.cwd, p.exit_code, p.signal) for p in procs] == [
        (11, 10, [b"ls", b"-l"], b"/ws/sub", None, 9),
        (10, None, [b"bash", b"-c", b"x"], b"/ws/sub", 2, None),
    ]
    assert t.root_exit == 2 and t.unparsed == 0


def test_exec_chain_reports_each_program_and_hides_marker() -> None:
    t = Tracker(root_cwd="/ws", hide_marker="DROP")
    out = feed(
        t,
        r"""
        5 1700000000.000001 execve("/py", ["py", "-c", "DROP", "1000"], 0x1 /* 1 vars */) = 0
        5 1700000000.000002 execve("/bin/sh", ["sh", "-c", "a; b"], 0x1 /* 1 vars */) = 0
        5 1700000000.000003 execve("/bin/b", ["b"], 0x1 /* 1 vars */) = 0
        5 1700000000.000004 +++ exited with 1 +++
    """,
    )
    assert [(p.argv, p.exit_code, p.end_ns) for p in out] == [
        ([b"sh", b"-c", b"a; b"], None, 1700000000000003000),
        ([b"b"], 1, 1700000000000004000),
    ]


def test_failed_exec_and_ipv6_connect() -> None:
    t = Tracker(root_cwd="/")
    out = feed(
        t,
        r"""
        7 1700000000.000001 execve("/nope", ["nope"], 0x1 /* 1 vars */) = -1 ENOENT (No such file or directory)
        7 1700000000.000002 execve("/bin/x", ["x"], 0x1 /* 1 vars */) = 0
        7 1700000000.000003 connect(4, {sa_family=AF_INET6, sin6_port=htons(80), sin6_flowinfo=htonl(0), inet_pton(AF_INET6, "::1", &sin6_addr), sin6_scope_id=0}, 28) = 0
        7 1700000000.000004 connect(5, {sa_family=AF_UNIX, sun_path="/var/run/nscd/socket"}, 110) = -1 ENOENT (No such file or directory)
        7 1700000000.000005 +++ exited with 0 +++
    """,  # noqa: E501 - verbatim strace lines; their length is the data
    )
    assert [type(m).__name__ for m in out] == ["Connect", "Proc"]
    assert out[0].host == "::1" and out[0].port == 80 and out[0].error is None and out[0].family == "inet6"
    assert out[1].argv == [b"x"]


def test_chunks_split_anywhere_give_the_same_records() -> None:
    """The shim reads strace's pipe in batches: a chunk may end mid-line or mid-character."""
    text = (
        '3 1700000000.000001 execve("/bin/sh", ["sh", "-c", "x"], 0x1 /* 1 vars */) = 0\n'
        "3 1700000000.000002 clone(child_stack=NULL, flags=SIGCHLD) = 4\n"
        '4 1700000000.000003 execve("/bin/echo", ["echo", "h\\303\\251", "\xe2\x82\xac"], 0x1 /* 1 '
        "vars */) = 0\n"
        "4 1700000000.000004 +++ exited with 0 +++\n"
        "3 1700000000.000005 +++ exited with 3 +++"  # the last line has no newline: flush() ends it
    ).encode("latin-1")
    whole = Tracker(root_cwd="/ws")
    expected = whole.feed_bytes(text) + whole.flush()
    assert [(p.pid, p.ppid, p.argv, p.exit_code) for p in expected] == [
        (4, 3, [b"echo", "hé".encode(), "€".encode()], 0),
        (3, None, [b"sh", b"-c", b"x"], 3),
    ]
    for size in (1, 2, 3, 7, 50):
        t = Tracker(root_cwd="/ws")
        out = []
        for i in range(0, len(text), size):
            out += t.feed_bytes(text[i : i + size])
        assert out + t.flush() == expected and t.unparsed == 0


def test_a_child_that_ends_before_its_parents_clone_returns_gets_its_parent() -> None:
    # Under load strace prints the parent's clone as unfinished, then the whole life of a quick
    # child (sh running /bin/true), and only then the clone's return: the child is reported then.
    t = Tracker(root_cwd="/ws")
    out = feed(
        t,
        r"""
        10 1700000000.000001 execve("/bin/sh", ["sh", "-c", "/bin/true; exit 7"], 0x7ffd /* 3 vars */) = 0
        10 1700000000.000020 vfork( <unfinished ...>
        11 1700000000.000030 execve("/bin/true", ["/bin/true"], 0x5 /* 3 vars */) = 0
        11 1700000000.000040 +++ exited with 0 +++
        10 1700000000.000050 <... vfork resumed>) = 11
        10 1700000000.000060 +++ exited with 7 +++
    """,
    )
    procs = [m for m in out if isinstance(m, Proc)]
    assert [(p.pid, p.ppid, p.argv, p.exit_code) for p in procs] == [
        (11, 10, [b"/bin/true"], 0),
        (10, None, [b"sh", b"-c", b"/bin/true; exit 7"], 7),
    ]
    assert t.unfinished(1700000001_000000000) == []


def test_a_child_whose_parents_clone_never_returns_is_still_reported() -> None:
    t = Tracker(root_cwd="/ws")
    out = feed(
        t,
        r"""
        10 1700000000.000001 execve("/bin/sh", ["sh", "-c", "x"], 0x7ffd /* 3 vars */) = 0
        10 1700000000.000020 clone(child_stack=NULL, flags=SIGCHLD <unfinished ...>
        11 1700000000.000030 execve("/bin/true", ["/bin/true"], 0x5 /* 3 vars */) = 0
        11 1700000000.000040 +++ exited with 0 +++
    """,
    )
    assert not [m for m in out if isinstance(m, Proc)]
    (child,) = [m for m in t.unfinished(1700000001_000000000) if isinstance(m, Proc) and m.pid == 11]
    assert (child.ppid, child.exit_code, child.end_ns) == (None, 0, 1700000000_000040000)


def test_names_that_are_not_utf8_keep_their_bytes() -> None:
    # strace writes a byte that is not printable as an octal escape (and may pass others raw): the
    # record has the bytes the kernel had, argv and cwd alike, and goes on the wire as they are.
    t = Tracker(root_cwd="/ws")
    lines = (
        b'10 1700000000.000001 execve("/bin/touch", ["touch", "x\\377", "a\\\\b", "\\303(", "raw\xfe"], '
        b"0x1 /* 1 vars */) = 0\n"
        b'10 1700000000.000002 chdir("d\\376") = 0\n'
        b"10 1700000000.000003 +++ exited with 0 +++\n"
    )
    (proc,) = t.feed_bytes(lines)
    assert proc.argv == [b"touch", b"x\xff", b"a\\b", b"\xc3(", b"raw\xfe"]
    assert proc.cwd == b"/ws/d\xfe"
    assert wire.decode(wire.encode(proc)[wire.HEADER.size :]) == proc  # (main: UnicodeEncodeError)
    assert t.unparsed == 0
    # fchdir's directory, as -yy prints it: the path with C escapes (its '>' escaped too).
    t = Tracker(root_cwd="/ws")
    lines = (
        b'10 1700000000.000001 execve("/bin/sh", ["sh"], 0x1 /* 1 vars */) = 0\n'
        b"10 1700000000.000002 fchdir(3</ws/d\\376/a\\\\b\\x3e>) = 0\n"
        b"10 1700000000.000003 +++ exited with 0 +++\n"
    )
    (proc,) = t.feed_bytes(lines)
    assert proc.cwd == b"/ws/d\xfe/a\\b>"  # (main: the escapes as written, /ws/d\376/a\\b\x3e)


def test_a_line_that_breaks_the_parser_is_counted_and_tracing_goes_on() -> None:
    t = Tracker(root_cwd="/ws")
    out = feed(
        t,
        r"""
        10 1700000000.000001 execve("/bin/sh", ["sh"], 0x1 /* 1 vars */) = 0
        10 1700000000.000002 chdir("unterminated) = 0
        10 1700000000.000003 +++ exited with 0 +++
    """,
    )
    assert [p.argv for p in out] == [[b"sh"]]
    assert t.unparsed == 1 and t.last_error is not None and "unterminated" in t.last_error


def test_a_signal_of_any_name_ends_a_process_with_its_number() -> None:
    # SIGPROF, SIGVTALRM, SIGWINCH... kill a process as surely as SIGKILL: the record says which one,
    # and the command's exit is 128 + its number (not 128 + 0).
    t = Tracker(root_cwd="/ws")
    out = feed(
        t,
        r"""
        5 1700000000.000001 execve("/bin/sh", ["sh"], 0x1 /* 1 vars */) = 0
        5 1700000000.000002 +++ killed by SIGPROF +++
    """,
    )
    assert [(p.exit_code, p.signal) for p in out] == [(None, 27)]
    assert t.root_exit == 128 + 27


def test_the_root_killed_by_a_signal_strace_did_not_name() -> None:
    t = Tracker(root_cwd="/ws")
    feed(t, r'5 1700000000.000001 execve("/bin/sh", ["sh"], 0x1 /* 1 vars */) = 0')
    out = t.root_killed(40, 1700000000000002000)  # a real-time signal: it has no name of its own
    assert [(p.exit_code, p.signal) for p in out] == [(None, 40)] and t.root_exit == 128 + 40
