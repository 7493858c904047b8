"""``python -m recorder.shim run --socket PATH --workspace DIR [options] -- CMD ARGS...``"""

from __future__ import annotations

import argparse
import os
import sys

from recorder.shim.shim import DEFAULT_CAP, Options, run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="amb-shim", description="Record processes and workspace changes of a command."
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run CMD under the shim")
    r.add_argument("--socket", required=True, help="unix socket of the recorder's receiver")
    r.add_argument("--workspace", required=True, help="directory whose changes are recorded")
    r.add_argument(
        "--content-cap",
        type=int,
        default=DEFAULT_CAP,
        help="bytes of content sent per file (above: hash only)",
    )
    r.add_argument(
        "--watch", action="append", default=[], help="a path whose opens are recorded (repeatable)"
    )
    r.add_argument(
        "--outside",
        action="append",
        default=[],
        help="a directory outside the workspace whose writes are recorded too (repeatable)",
    )
    r.add_argument(
        "--private-dir",
        default=None,
        help="a directory the agent cannot write to, for the shim's own files (default: the temp dir)",
    )
    r.add_argument("--tracer", choices=("auto", "seccomp-notify", "strace", "proc-poll"), default="auto")
    r.add_argument("--agent-uid", type=int, default=None, help="run CMD as this uid (the shim stays root)")
    r.add_argument("--agent-gid", type=int, default=None)
    r.add_argument("--linger", type=float, default=2.0, help="seconds children may outlive CMD")
    r.add_argument(
        "--hex-command",
        action="store_true",
        help="each word of CMD is the hex of its bytes (for a launcher, such as Docker's API, that "
        "carries UTF-8 text only, while an argument may be any bytes)",
    )
    r.add_argument(
        "--stop-on-oom",
        action="store_true",
        help="stop CMD at the first OOM kill in the shim's memory cgroup (a container's)",
    )
    r.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no command given (put it after --)")
    if args.hex_command:
        try:
            command = [os.fsdecode(bytes.fromhex(word)) for word in command]
        except ValueError:
            p.error("--hex-command: a word of the command is not hex")
    return run(
        Options(
            socket=args.socket,
            workspace=args.workspace,
            argv=command,
            content_cap=args.content_cap,
            watched=args.watch,
            outside=args.outside,
            tracer=args.tracer,
            agent_uid=args.agent_uid,
            agent_gid=args.agent_gid,
            linger=args.linger,
            private_dir=args.private_dir,
            stop_on_oom=args.stop_on_oom,
        )
    )


if __name__ == "__main__":
    sys.exit(main())
