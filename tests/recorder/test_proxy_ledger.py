"""The tool-call ledger on conversations written by hand, in each API's wire format: the ids calls are
recorded under and which call each result answers, when conversations share their opening, run
interleaved, repeat a call, restart, retry, edit their history, or come from a provider whose ids
are missing or reused. Each conversation goes through the real parsers (``calls.parse_request`` and
``calls.parse_response``) and ``Ledger.record``, as the sink drives them."""

from __future__ import annotations

import json
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recorder.proxy import calls
from recorder.proxy.custody import Custody
from recorder.proxy.ledger import Ledger
from recorder.proxy.sink import CallFacts, Sink
from recorder.spool import spool_path
from schemas.codec import decode_event
from schemas.events import ToolCallRequested, ToolCallResult
from schemas.frames import scan
from schemas.providers import CHAT, GENERATE, MESSAGES, RESPONSES, Api

Call = tuple[str | None, str, dict[str, Any]]
"""A tool call as the model makes it: (the provider's id or None, name, arguments)."""


class Dialect:
    """One API's wire format for a conversation's items, requests and answers."""

    api: Api
    ctype = "application/json"

    def user(self, text: str) -> dict[str, Any]:
        return {"role": "user", "content": text}

    def request(self, items: list[Any], previous: str | None = None) -> dict[str, Any]:
        return {"model": "m", "messages": items}

    def answer(self, asked: list[Call], n: int) -> dict[str, Any]:
        """The model's answer (the ``n``-th call of the run), asking for ``asked``."""
        raise NotImplementedError

    def echo(self, asked: list[Call]) -> list[Any]:
        """That answer as the client puts it in its next request."""
        raise NotImplementedError

    def results(self, asked: list[Call], outputs: list[str]) -> list[Any]:
        """The client's answers to ``asked``."""
        raise NotImplementedError


class Gemini(Dialect):
    api = GENERATE

    def user(self, text: str) -> dict[str, Any]:
        return {"role": "user", "parts": [{"text": text}]}

    def request(self, items, previous=None):
        return {"contents": items, "tools": [{"functionDeclarations": [{"name": "f"}]}]}

    def _fc(self, c: Call) -> dict[str, Any]:
        return {"functionCall": {"name": c[1], "args": c[2], **({"id": c[0]} if c[0] is not None else {})}}

    def answer(self, asked: list[Call], n: int) -> dict[str, Any]:
        parts = [{"text": "ok"}, *map(self._fc, asked)]
        return {"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP"}]}

    def echo(self, asked: list[Call]) -> list[dict[str, Any]]:
        return [{"role": "model", "parts": [{"text": "ok"}, *map(self._fc, asked)]}]

    def results(self, asked: list[Call], outputs: list[str]) -> list[dict[str, Any]]:
        parts = [
            {"functionResponse": {"name": c[1], "response": {"output": o}, **({"id": c[0]} if c[0] else {})}}
            for c, o in zip(asked, outputs, strict=True)
        ]
        return [{"role": "user", "parts": parts}]


class Chat(Dialect):
    api = CHAT

    def _message(self, asked: list[Call]) -> dict[str, Any]:
        return {
            "role": "assistant",
            "content": None if asked else "ok",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)},
                    **({"id": cid} if cid is not None else {}),
                }
                for cid, name, args in asked
            ],
        }

    def answer(self, asked, n):
        return {
            "id": f"chatcmpl-{n}",
            "choices": [{"message": self._message(asked), "finish_reason": "stop"}],
        }

    def echo(self, asked):
        return [self._message(asked)]

    def results(self, asked, outputs):
        return [
            {"role": "tool", "content": o, **({"tool_call_id": c[0]} if c[0] is not None else {})}
            for c, o in zip(asked, outputs, strict=True)
        ]


class Messages(Dialect):
    api = MESSAGES

    def _blocks(self, asked: list[Call]) -> list[dict[str, Any]]:
        return [
            {"type": "tool_use", "id": cid or "", "name": name, "input": args} for cid, name, args in asked
        ]

    def answer(self, asked, n):
        return {"content": [{"type": "text", "text": "ok"}, *self._blocks(asked)], "stop_reason": "tool_use"}

    def echo(self, asked):
        return [{"role": "assistant", "content": [{"type": "text", "text": "ok"}, *self._blocks(asked)]}]

    def results(self, asked, outputs):
        blocks = [
            {"type": "tool_result", "tool_use_id": c[0] or "", "content": o}
            for c, o in zip(asked, outputs, strict=True)
        ]
        return [{"role": "user", "content": blocks}]


class Responses(Dialect):
    api = RESPONSES

    def request(self, items, previous=None):
        return {"model": "m", "input": items, **({"previous_response_id": previous} if previous else {})}

    def _items(self, asked: list[Call]) -> list[dict[str, Any]]:
        return [
            {"type": "function_call", "call_id": cid or "", "name": name, "arguments": json.dumps(args)}
            for cid, name, args in asked
        ]

    def answer(self, asked, n):
        return {
            "id": f"resp_{n}",
            "status": "completed",
            "output": [{"type": "reasoning"}, *self._items(asked)],
        }

    def echo(self, asked):
        return self._items(asked)

    def results(self, asked, outputs):
        return [
            {"type": "function_call_output", "call_id": c[0] or "", "output": o}
            for c, o in zip(asked, outputs, strict=True)
        ]


DIALECTS = {"gemini": Gemini(), "chat": Chat(), "messages": Messages(), "responses": Responses()}
PROVIDER = {"gemini": "gemini", "chat": "openai", "messages": "anthropic", "responses": "openai"}


@dataclass
class Run:
    """One run's ledger and its model calls, numbered as the proxy would see them."""

    dialect: str
    ledger: Ledger = field(default_factory=Ledger)
    n: int = 0

    def call(self, body: dict[str, Any], answer: dict[str, Any]) -> tuple[list[str], list[tuple[str, str]]]:
        """One model call: (ids of the calls its answer asked for, (call id, output) of each tool
        result recorded with it)."""
        d = DIALECTS[self.dialect]
        info = calls.parse_request(d.api, json.dumps(body).encode())
        result, _, _ = calls.parse_response(d.api, json.dumps(answer).encode(), None, d.ctype)
        fresh = self.ledger.record(PROVIDER[self.dialect], info, result)
        return [t.id for t in result.message().tool_calls], [(r.tool_call_id, r.output) for r in fresh]

    def conversation(self, opening: str = "fix the failing test") -> Conversation:
        return Conversation(self, [DIALECTS[self.dialect].user(opening)])


@dataclass
class Conversation:
    run: Run
    items: list[Any]
    asked: list[Call] = field(default_factory=list)
    response_id: str | None = None

    def send(self, asked: list[Call], *, previous: bool = False) -> tuple[list[str], list[tuple[str, str]]]:
        """Sends the conversation; the model answers asking for ``asked``. ``previous``: send only
        what is new and name the previous response (the Responses API keeping the history)."""
        d, run = DIALECTS[self.run.dialect], self.run
        run.n += 1
        body = d.request(self.items, self.response_id if previous else None)
        got = run.call(body, d.answer(asked, run.n))
        self.asked, self.response_id = asked, f"resp_{run.n}"
        if previous:
            self.items = []
        else:
            self.items = self.items + d.echo(asked)
        return got

    def ask(self, call: Call, output: str) -> tuple[str, list[tuple[str, str]]]:
        """Sends the conversation, the model asks for ``call``, the tool answers ``output``: the
        call's id, and the results recorded with the request."""
        (cid,), results = self.send([call])
        self.answer(output)
        return cid, results

    def answer(self, *outputs: str) -> None:
        self.items = self.items + DIALECTS[self.run.dialect].results(self.asked, list(outputs))

    def say(self, text: str) -> None:
        self.items = self.items + [DIALECTS[self.run.dialect].user(text)]

    def fork(self) -> Conversation:
        return Conversation(self.run, list(self.items), self.asked, self.response_id)


CASES = [
    (dialect, mode)
    for dialect in DIALECTS
    for mode in ("none", "reused", "unique")
    if mode != "none" or dialect in ("gemini", "chat")  # Messages and Responses cannot do without
]
"""The provider's ids: none (Gemini's usual; a Chat gateway's), one gateway reuses in every answer
(``call_0``, ``call_1`` by position), or one of its own for every call."""


def read(mode: str, n: int, path: str, index: int = 0, name: str = "read_file") -> Call:
    cid = {"none": None, "reused": f"call_{index}", "unique": f"call_{n}_{index}"}[mode]
    return (cid, name, {"path": path})


def twins(run: Run, mode: str) -> tuple[Conversation, Conversation, str, str]:
    """Two conversations with one opening, each asked by the model to read a file of its own; the
    ids their calls were recorded under."""
    x, y = run.conversation(), run.conversation()
    (x_call,), none = x.send([read(mode, 1, "x.py")])
    (y_call,), _ = y.send([read(mode, 2, "y.py")])
    assert none == [] and x_call != y_call
    return x, y, x_call, y_call


def nothing_twice(*conversations: Conversation) -> None:
    """Each resends its whole history with a new message: nothing is recorded twice."""
    for c in conversations:
        c.say("go on")
        assert c.send([]) == ([], [])


@pytest.mark.parametrize(("dialect", "mode"), CASES)
def test_two_conversations_with_one_opening_interleaved(dialect, mode):
    x, y, x_call, y_call = twins(Run(dialect), mode)
    x.answer("x says hi")
    y.answer("y says hi")
    # Y goes on first: its result pairs with its own call, not with the older one of X.
    assert y.send([]) == ([], [(y_call, "y says hi")])
    assert x.send([]) == ([], [(x_call, "x says hi")])
    nothing_twice(x, y)


@pytest.mark.parametrize(("dialect", "mode"), CASES)
def test_identical_conversations_each_get_their_call_and_their_result(dialect, mode):
    # Word for word the same up to the results (sub-agents handed one instruction, a model that
    # answers alike): which call a result pairs with cannot be told, but none is lost or doubled.
    run = Run(dialect)
    x, y = run.conversation(), run.conversation()
    (x_call,), _ = x.send([read(mode, 1, "same.py")])
    (y_call,), _ = y.send([read(mode, 1, "same.py")])
    assert x_call != y_call
    y.answer("same output")
    x.answer("same output")
    _, y_results = y.send([])
    _, x_results = x.send([])
    assert sorted(y_results + x_results) == sorted([(x_call, "same output"), (y_call, "same output")])
    nothing_twice(x, y)


@pytest.mark.parametrize(("dialect", "mode"), CASES)
def test_an_identical_call_repeated_in_one_conversation_is_two_calls(dialect, mode):
    c = Run(dialect).conversation()
    first, _ = c.ask(read(mode, 1, "a.py"), "version 1")
    second, results = c.ask(read(mode, 1, "a.py"), "version 2")
    assert results == [(first, "version 1")] and second != first
    assert c.send([]) == ([], [(second, "version 2")])


@pytest.mark.parametrize(("dialect", "mode"), CASES)
def test_parallel_calls_each_get_their_result(dialect, mode):
    c = Run(dialect).conversation()
    asked = [read(mode, 1, "a.py"), read(mode, 1, ".", index=1, name="list_dir")]
    ids, _ = c.send(asked)
    if mode == "none":
        c.answer("A", "B")
    else:  # answered in the other order, each naming its call
        c.asked = asked[::-1]
        c.answer("B", "A")
    _, results = c.send([])
    assert sorted(results) == sorted([(ids[0], "A"), (ids[1], "B")])


@pytest.mark.parametrize(("dialect", "mode"), CASES)
def test_a_restart_that_resends_the_history_records_nothing_twice(dialect, mode):
    c = Run(dialect).conversation()
    first, _ = c.ask(read(mode, 1, "a.py"), "one")
    second, _ = c.ask(read(mode, 2, "b.py"), "two")
    again = c.fork()  # the agent fails here and starts again from what it had saved
    assert c.send([]) == ([], [(second, "two")])
    (third,), results = again.send([read(mode, 3, "c.py")])
    assert results == [] and len({first, second, third}) == 3
    again.answer("three")
    assert again.send([]) == ([], [(third, "three")])


@pytest.mark.parametrize(("dialect", "mode"), CASES)
def test_a_retried_request_pairs_with_the_answer_the_client_kept(dialect, mode):
    c = Run(dialect).conversation()
    lost = c.fork()
    (dropped,), _ = lost.send([read(mode, 1, "a.py")])  # the client timed out on this one
    (kept,), _ = c.send([read(mode, 2, "a.py")])
    c.answer("from the retry")
    assert c.send([]) == ([], [(kept, "from the retry")])
    assert dropped != kept


def _clear_first_output(items: list[Any]) -> None:
    """An Anthropic client moves cache_control to the newest turn, and clears an old tool output."""
    items[2]["content"][0] = {**items[2]["content"][0], "content": "[cleared]"}
    items[-1]["content"][0]["cache_control"] = {"type": "ephemeral"}


def _clear_first_response(items: list[Any]) -> None:
    """A Gemini client clears an old function response (no ids: the opening and the length tell)."""
    items[2]["parts"][0]["functionResponse"]["response"] = {"output": "[cleared]"}


@pytest.mark.parametrize(
    ("dialect", "mode", "edit"),
    [("messages", "unique", _clear_first_output), ("gemini", "none", _clear_first_response)],
)
def test_a_history_edited_in_the_middle_records_only_the_new_result(dialect, mode, edit):
    c = Run(dialect).conversation()
    c.ask(read(mode, 1, "a.py"), "a long file")
    second, _ = c.ask(read(mode, 2, "b.py"), "b")
    edit(c.items)
    assert c.send([]) == ([], [(second, "b")])


def test_a_gemini_answer_kept_as_one_content_per_streamed_chunk():
    # google-genai's chats keep a streamed answer as one model content per chunk: the model turn
    # is the run of them, where the answer went, whichever chunk held the function call.
    x, y, x_call, y_call = twins(Run("gemini"), "none")
    x.items[1:] = [{"role": "model", "parts": [p]} for p in x.items[1]["parts"]]  # text, then the call
    assert len(x.items) == 3
    x.answer("x out")
    y.answer("y out")
    assert x.send([]) == ([], [(x_call, "x out")])
    assert y.send([]) == ([], [(y_call, "y out")])


def test_responses_naming_the_previous_response_with_reused_ids():
    x, y, x_call, y_call = twins(Run("responses"), "reused")
    x.answer("x out")
    y.answer("y out")
    assert y.send([], previous=True) == ([], [(y_call, "y out")])
    assert x.send([], previous=True) == ([], [(x_call, "x out")])


def test_missing_ids_get_ids_of_their_own_and_results_pair_by_position():
    c = Run("chat").conversation()
    ids, _ = c.send([(None, "read_file", {"path": "a"}), (None, "read_file", {"path": "b"})])
    assert ids == ["openai-1-1-0", "openai-1-1-1"]
    c.answer("A", "B")
    assert c.send([]) == ([], [(ids[0], "A"), (ids[1], "B")])


def test_reused_ids_keep_the_first_and_suffix_the_rest():
    run = Run("chat")
    x, y = run.conversation(), run.conversation("another task")
    assert x.send([read("reused", 0, "a")])[0] == ["call_0"]
    assert y.send([read("reused", 0, "b")])[0] == ["call_0~2-1-0"]


def script(run: Run) -> list[Any]:
    """A fixed interleaving of three conversations; what the ledger made of it."""
    out: list[Any] = []
    convs = [run.conversation(), run.conversation(), run.conversation("other")]
    for step in range(4):
        for i, c in enumerate(convs):
            out.append(c.send([read("none", step, f"{i}-{step}.py")]))
            c.answer(f"out {i} {step}")
    return out


def test_ids_depend_only_on_the_order_of_the_calls():
    assert script(Run("gemini")) == script(Run("gemini"))


def test_memory_stays_bounded_and_recent_calls_still_pair():
    run = Run("gemini", Ledger(capacity=32))
    c, previous = run.conversation(), ""
    for i in range(300):
        other = run.conversation(f"one-off {i}")
        other.send([read("none", i, "x")])
        (asked,), results = c.send([read("none", i, f"{i}.py")])
        assert results == ([] if i == 0 else [(previous, f"out {i - 1}")])
        c.answer(f"out {i}")
        previous = asked
    assert run.ledger.footprint() <= 32 * 4


# -- the sink: a record waits for the records its request may answer -------------------------------


def test_a_record_waits_for_the_record_of_the_call_it_answers(tmp_path):
    # A streamed answer reaches the client before its record is written: the next request, with
    # the function response, may be answered (fast) while that record is still being written (a
    # large one, on a worker). The sink names that record, so the addon lets it finish first.
    d, sink = Gemini(), Sink(tmp_path, "run-ledger", Custody())
    try:
        opening = [d.user("fix the failing test")]
        asked = [read("none", 1, "a.py")]
        url = "http://127.0.0.1:9/v1beta/models/g:streamGenerateContent"

        def facts(call_id: str, request: Future, answer: dict) -> CallFacts:
            body = json.dumps(answer).encode()
            return CallFacts(call_id, GENERATE, url, request, 0, 200, [body], None, "application/json")

        held: Future = Future()  # the first call's record is busy (held at its request's parse)
        first = facts("first", held, d.answer(asked, 1))
        sink.record_call(first)
        second_body = json.dumps(d.request([*opening, *d.echo(asked), *d.results(asked, ["done"])])).encode()
        second = facts("second", sink.prepare_request(GENERATE, second_body, None), d.answer([], 2))
        second.request.result(5)
        assert sink.writing_before(second) == [first.written]
        held.set_result(
            sink.prepare_request(GENERATE, json.dumps(d.request(opening)).encode(), None).result()
        )
        first.written.result(5)
        assert sink.writing_before(second) == []
        sink.record_call(second).result(5)
    finally:
        sink.close()
    events = [
        decode_event(b).payload for b in scan(spool_path(tmp_path, "run-ledger", "proxy").read_bytes()).bodies
    ]
    (requested,) = [e for e in events if isinstance(e, ToolCallRequested)]
    (result,) = [e for e in events if isinstance(e, ToolCallResult)]
    assert (result.tool_call_id, result.model_call_id, result.output) == (
        requested.tool_call_id,
        "second",
        "done",
    )


# -- hostile input ---------------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
KEYS = ["contents", "messages", "input", "previous_response_id", "parts", "tool_calls", "role", "type"]


def shaped() -> st.SearchStrategy[Any]:
    """Bodies near the APIs' shapes (their keys, lists of dicts), with anything as values."""
    item = st.dictionaries(
        st.sampled_from([*KEYS, "functionCall", "functionResponse", "id", "call_id"]), JSON
    )
    return st.dictionaries(st.sampled_from(KEYS), st.lists(item, max_size=5) | JSON) | JSON


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(list(DIALECTS)), shaped(), shaped()), max_size=8))
def test_hostile_bodies_never_break_the_ledger_and_ids_stay_unique(steps):
    ledger, seen = Ledger(capacity=4), set[str]()
    for dialect, body, answer in steps:
        api = DIALECTS[dialect].api
        info = calls.parse_request(api, json.dumps(body).encode())
        result, _, _ = calls.parse_response(api, json.dumps(answer).encode(), None, "application/json")
        ledger.record(PROVIDER[dialect], info, result)
        ids = [t.id for t in result.message().tool_calls]
        assert all(ids) and seen.isdisjoint(ids) and len(set(ids)) == len(ids)
        seen.update(ids)
