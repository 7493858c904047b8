"""The recording proxy: a mitmproxy addon (``addon``) run in-process (``server``), provider parsers
(``openai_chat``, ``openai_responses``, ``anthropic_messages``), the write side (``sink``,
``blobwriter``) and credential custody (``custody``). See docs/recording.md."""
