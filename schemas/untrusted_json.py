"""JSON that an agent or its model wrote, decoded without letting it exhaust the stack.

Python's decoders (``json``, msgspec) recurse once per level of nesting. A document nested 100,000
deep makes them raise ``RecursionError`` (not ``ValueError``, so a caller that handles bad JSON
crashes anyway), and on the way takes the stack to its limit, where whatever runs meanwhile (a
garbage collection's finalizers) fails too. Every reader of agent-written JSON outside the
recorder's hot path measures the nesting first, without recursion, and refuses a document nested
deeper than ``MAX_JSON_DEPTH`` as not JSON. Standard library only: ``schemas`` is imported by all.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

MAX_JSON_DEPTH = 200
"""Arrays and objects nested deeper than this are refused: far deeper than any real document (a
prediction is 3 levels deep, a request body with tool schemas a few dozen), far shallower than
Python's recursion limit (1,000), which a decoder otherwise reaches."""

JSON_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+(?:"|\\?\Z)', re.DOTALL)
"""A JSON string, escapes included, or an unterminated one to the end of the input: possessive, and
every quote starts a match that succeeds, so the blanking is linear whatever the input."""
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def json_depth(raw: bytes | str) -> int:
    """The deepest nesting of arrays and objects in a JSON document, found without recursion: its
    strings blanked, then a running count of brackets. Exact for valid JSON; for invalid JSON, at
    least the depth a decoder reaches before the first error (both read strings the same way)."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    brackets = JSON_STRING.sub(b'""', data).translate(None, _NOT_BRACKETS)
    return max(accumulate((_STEP[b] for b in brackets), initial=0))


def check_json_depth(raw: bytes | str, limit: int = MAX_JSON_DEPTH) -> None:
    """``ValueError`` saying so when ``raw`` nests deeper than ``limit``."""
    depth = json_depth(raw)
    if depth > limit:
        raise ValueError(f"nested {depth} levels deep; at most {limit} are accepted")


def loads_untrusted(raw: bytes | str) -> Any:
    """``json.loads`` of text an agent or a model wrote: ``ValueError`` for anything that is not JSON
    or nests deeper than ``MAX_JSON_DEPTH``, never a ``RecursionError``."""
    check_json_depth(raw)
    return json.loads(raw)
