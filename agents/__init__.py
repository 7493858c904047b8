"""Agents that amb records: the reference agent loop (amb-agent) and the offline scripted baseline."""
