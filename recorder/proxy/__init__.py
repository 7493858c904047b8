"""The recording proxy: a mitmproxy addon (``addon``) run in-process (``server``), the destination
gate (``gate``), the write side (``sink``, ``blobwriter``, ``ledger``) and credential custody
(``custody``). See docs/recording.md."""
