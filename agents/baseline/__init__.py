"""The offline baseline: a loopback OpenAI-compatible server whose model is a scripted policy."""
