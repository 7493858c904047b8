"""Replay: a recorded run's model calls served back over the APIs the proxy records.

``recorded`` loads the calls and matches requests to them; ``server`` speaks every API of the provider
layer (OpenAI Chat Completions and Responses, Anthropic Messages, Gemini ``generateContent`` and
``streamGenerateContent``), streaming or not, from the recorded bytes.
``amb replay serve RUN`` runs it alone; ``amb-record --replay RUN`` points a new recording at it.
"""
