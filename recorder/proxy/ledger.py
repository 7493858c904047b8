"""The tool-call ledger: the id each tool call of a run is recorded under, and which call each tool
result answers (the rules in full: docs/recording.md, "Tool call ids and pairing").

Providers' ids cannot tell calls apart (Gemini usually sends none, a gateway may call every one
``call_0``), so a call is known by the conversation it was made in, and a conversation by the
history its requests carry (``recorder.proxy.history``). Each recorded model call leaves a head:
the history its request sent and the calls its response asked for. A request continues the best
head its history extends (``_Head.rank``), in that head's thread unless the head was continued
already; its results are paired with the head's calls, else with ``_candidates``, else recorded
once under their own id (``_unknown``).

The ids depend only on the order in which the calls are recorded, so recording the same requests
again gives the same ids. The ledger keeps the latest ``MAX_HEADS`` heads of a run: its memory is
bounded, and a conversation idle for longer starts a new thread.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from recorder.proxy.history import Sig, args_digest, signature
from schemas.providers.result import Reassembled, RequestInfo, ToolResult

MAX_HEADS = 16_384
"""Heads kept per run (a few hundred bytes each)."""

_Place = tuple[str, int, int]
"""Where a model call is: (provider, thread, step)."""


@dataclass(slots=True, eq=False)
class _Call:
    id: str
    wire: str
    name: str
    answer: int | None = None
    """Digest of the output that answered it (None: still open)."""


@dataclass(slots=True, eq=False)
class _Head:
    key: int | None
    """The last link of its request's history (None: the request carried none)."""
    length: int
    opening: int | None
    thread: int
    step: int
    calls: list[_Call]
    sig: Sig
    ids: frozenset[str]
    """The provider's ids of its calls (empty ones left out)."""
    response_id: str | None
    continued: bool = False

    def rank(self, shown: _Shown) -> tuple[bool, bool, bool]:
        """How well the head fits a request showing ``shown`` where its answer goes (lowest best):
        the same call ids, the same calls, not yet continued."""
        ids, sig = shown
        return (ids.isdisjoint(self.ids), self.sig != sig, self.continued)


_Shown = tuple[frozenset[str], Sig]
"""A model turn as a request shows it: its calls' ids, and the calls (``ModelTurn``)."""


def _shown(info: RequestInfo, position: int) -> _Shown:
    turn = info.model_turns.get(position)
    return (turn.ids, signature(turn.calls)) if turn is not None else (frozenset(), ())


def _pick(calls: list[_Call], r: ToolResult) -> _Call | None:
    """The call of one response that ``r`` answers: same id, else same position, else same name."""
    if r.wire:
        for c in calls:
            if c.wire == r.wire:
                return c
    if 0 <= r.index < len(calls) and (not r.name or calls[r.index].name == r.name):
        return calls[r.index]
    named = [c for c in calls if c.name == r.name]
    return next((c for c in named if c.answer is None), named[0] if named else None)


class Ledger:
    """One run's tool calls (see the module's docstring). Not thread-safe: the sink holds a lock."""

    def __init__(self, capacity: int = MAX_HEADS):
        self.capacity = capacity
        self._heads: deque[_Head] = deque()
        self._by_key: dict[int, list[_Head]] = {}
        self._by_opening: dict[tuple[int, int], list[_Head]] = {}
        self._by_response: dict[str, _Head] = {}
        self._by_id: dict[str, _Call] = {}
        self._by_wire: dict[str, list[_Call]] = {}
        self._dangling: dict[str | int, None] = {}
        """Results whose call was never seen, by the id they give it, else by their history
        (insertion-ordered, capped)."""
        self._threads = 0

    def footprint(self) -> int:
        """Entries held: heads, calls and results without a call, each under every index (the
        capacity bounds it: a few per head)."""
        held = len(self._by_key) + len(self._by_opening) + len(self._by_response) + len(self._by_id)
        return len(self._heads) + held + len(self._by_wire) + len(self._dangling)

    def record(self, provider: str, info: RequestInfo, result: Reassembled) -> list[ToolResult]:
        """One model call, in the order the calls are recorded: gives the response's tool calls
        their ids (in ``result``) and returns the request's tool results to record, each with the
        id of the call it answers."""
        parent, m, named = self._parent(info)
        if parent is not None and not parent.continued:
            thread, step = parent.thread, parent.step + 1
        else:
            self._threads += 1
            thread, step = self._threads, 1
        if parent is not None:
            parent.continued = True
        place = (provider, thread, step)
        fresh = [
            r for k, r in enumerate(info.tool_results) if self._answer(place, k, info, r, parent, m, named)
        ]
        self._add(place, info, result)
        return fresh

    def _parent(self, info: RequestInfo) -> tuple[_Head | None, int, bool]:
        """The head the request continues, the length of its history, and whether the request
        named it (a previous response) rather than carrying its history."""
        if info.previous is not None and info.previous in self._by_response:
            return self._by_response[info.previous], 0, True
        links = info.chain
        for m in range(len(links) - 2, 0, -1):  # the longest history it extends, of at least one item
            heads = self._by_key.get(links[m])
            if heads:
                shown = _shown(info, m)
                # min() keeps the first of equals: the latest (an agent restarted is its latest try).
                return min(reversed(heads), key=lambda h: h.rank(shown)), m, False
        return None, 0, False

    def _answer(
        self,
        place: _Place,
        k: int,
        info: RequestInfo,
        r: ToolResult,
        parent: _Head | None,
        m: int,
        named: bool,
    ) -> bool:
        """Whether ``r`` (the request's ``k``-th result) is new (then its ``tool_call_id`` is set)."""
        if parent is not None and r.position < m:
            return False  # the head's own request carried it (most of a long history: cheap)
        out = hash(r.output)
        if parent is not None and (r.turn == m or (named and r.turn < 0)):
            call = _pick(parent.calls, r)
            if call is not None:
                return self._pair(call, r, out)
        candidates = self._candidates(info, r)
        if candidates:
            if any(c.answer == out for c in candidates):
                return False
            call = next((c for c in candidates if c.answer is None), None)
            return call is not None and self._pair(call, r, out)
        return self._unknown(place, k, info, r)

    def _candidates(self, info: RequestInfo, r: ToolResult) -> list[_Call]:
        """The calls ``r`` may answer when the head its request continues does not tell."""
        found: list[_Call] = []
        t, links = r.turn, info.chain
        if 1 <= t < len(links):
            heads = self._by_key.get(links[t]) or self._by_opening.get((links[1], t)) or []
            shown = _shown(info, t)
            for h in sorted(reversed(heads), key=lambda h: h.rank(shown)[:2]):  # stable: latest first
                call = _pick(h.calls, r)
                if call is not None:
                    found.append(call)
        if not found and r.wire:
            found = list(reversed(self._by_wire.get(r.wire, ())))
            if not found and r.wire in self._by_id:
                found = [self._by_id[r.wire]]
        return found

    def _pair(self, call: _Call, r: ToolResult, out: int) -> bool:
        if call.answer is not None:
            return False  # answered already: this is that answer sent again
        call.answer = out
        r.tool_call_id = call.id
        return True

    def _unknown(self, place: _Place, k: int, info: RequestInfo, r: ToolResult) -> bool:
        """A result whose call was never seen (or is forgotten): recorded once, under the id the
        request gives its call, else ``<provider>-<thread>-<step>-r<k>`` (this request's k-th)."""
        seen: str | int = r.wire or (
            info.chain[r.position + 1] if 0 <= r.position < len(info.chain) - 1 else -1
        )
        if seen in self._dangling:
            return False
        self._dangling[seen] = None
        if len(self._dangling) > self.capacity:
            del self._dangling[next(iter(self._dangling))]
        provider, thread, step = place
        r.tool_call_id = self._free(r.wire or f"{provider}-{thread}-{step}-r{k}")
        return True

    def _free(self, rid: str) -> str:
        """``rid``, told apart from the ids of the calls kept (a provider's id may look like ours)."""
        while rid in self._by_id:
            rid += "~"
        return rid

    def _add(self, place: _Place, info: RequestInfo, result: Reassembled) -> None:
        provider, thread, step = place
        calls = []
        for index, t in enumerate(result.tool_calls.values()):
            wire = t["id"]
            if wire and wire not in self._by_id:
                rid = wire
            else:
                rid = f"{wire}~" if wire else f"{provider}-"
                rid += f"{thread}-{step}-{index}"
            t["id"] = rid = self._free(rid)
            calls.append(_Call(rid, wire, t["name"]))
        n = len(info.chain) - 1
        head = _Head(
            key=info.chain[-1] if n >= 1 else None,
            length=max(n, 0),
            opening=info.chain[1] if n >= 1 else None,
            thread=thread,
            step=step,
            calls=calls,
            sig=tuple((t["name"], args_digest("".join(t["args"]))) for t in result.tool_calls.values()),
            ids=frozenset(c.wire for c in calls if c.wire),
            response_id=result.response_id,
        )
        if head.key is None and not calls and head.response_id is None:
            return  # nothing later can refer to it
        self._heads.append(head)
        if head.key is not None and head.opening is not None:
            self._by_key.setdefault(head.key, []).append(head)
            self._by_opening.setdefault((head.opening, head.length), []).append(head)
        if head.response_id is not None:
            self._by_response[head.response_id] = head
        for c in calls:
            self._by_id[c.id] = c
            if c.wire:
                self._by_wire.setdefault(c.wire, []).append(c)
        if len(self._heads) > self.capacity:
            self._forget(self._heads.popleft())

    def _forget(self, head: _Head) -> None:
        if head.key is not None and head.opening is not None:
            _drop(self._by_key, head.key, head)
            _drop(self._by_opening, (head.opening, head.length), head)
        if head.response_id is not None and self._by_response.get(head.response_id) is head:
            del self._by_response[head.response_id]
        for c in head.calls:
            if self._by_id.get(c.id) is c:
                del self._by_id[c.id]
            if c.wire:
                _drop(self._by_wire, c.wire, c)


def _drop(index: dict, key: object, item: object) -> None:
    items = index.get(key)
    if items is not None:
        items.remove(item)
        if not items:
            del index[key]
