"""The shim: records what actually happens around an agent, whatever the agent says.

It runs inside the agent container (or around a local run) and observes:

- every process: argv, cwd, pid, ppid, start, end, exit code or signal (seccomp user notification
  plus a light ptrace, ``notify``, where permitted; else ``strace -f --seccomp-bpf``; else a
  clearly labelled ``proc-poll`` fallback);
- every file created, modified, deleted or renamed under the workspace, with size, sha256 and
  content up to a per-file cap (inotify, plus a final reconcile scan so nothing is lost);
- opens of watched (forbidden) paths, where they exist and inotify can see them;
- network connects (``connect(2)`` to IPv4/IPv6 peers), so direct egress attempts are facts.

Events leave as they happen, over a unix socket, to ``recorder.shim.receiver`` on the host, which
appends them to the run's ``shim`` spool and stores contents as blobs. The agent therefore cannot
edit or delete what was already recorded.

Container-side modules (``wire``, ``seccomp``, ``notify``, ``launch``, ``kernel``, ``connects``, ``strace``,
``watch``, ``procpoll``, ``oomwatch``, ``shim``, ``__main__``) use the standard library and msgspec only:
they are copied into the agent image on their own (``amb.images.SHIM_FILES``).
``receiver`` and ``local`` run on the host and may import ``schemas`` and ``recorder``.
"""
