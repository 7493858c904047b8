"""The shim: records what actually happens around an agent, whatever the agent says.

It runs inside the agent container (or around a local run) and observes every process (``notify``,
else ``strace``, else a labelled ``procpoll``), every file change under the workspace (``watch``),
opens of watched paths and network connects (docs/containers.md). Events leave as they happen, over
a unix socket, to ``recorder.shim.receiver`` on the host, which appends them to the run's ``shim``
spool: the agent cannot edit or delete what was already recorded.

Container-side modules (``wire``, ``seccomp``, ``notify``, ``launch``, ``kernel``, ``connects``, ``strace``,
``watch``, ``procpoll``, ``oomwatch``, ``shim``, ``__main__``) use the standard library and msgspec only:
they are copied into the agent image on their own (``amb.images.SHIM_FILES``).
``receiver`` and ``local`` run on the host and may import ``schemas`` and ``recorder``.
"""
