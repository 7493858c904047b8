"""Schemas: the event union and envelope, blob references, canonical encoding and hashing.

Pure: imports msgspec and the standard library only.
"""
