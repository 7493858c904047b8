"""The recording proxy refuses destinations that are not the outside world or a configured upstream.

End to end: a real agent run by ``amb-record`` asks the real proxy for a service this test runs on
loopback, by every spelling of loopback (and for private, link-local and this host's own addresses,
which are refused before any connection is made). Each is answered 403, nothing reaches the
service, and each is recorded as a ``network.request`` with its ``blocked`` reason. An
``--allow-host`` destination and the configured upstream (the loopback fake) still work.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from recorder.proxy.gate import Destinations, own_addresses, parse_host_port, why_blocked
from tests.amb.test_record_cli import amb_record, sql
from tests.fakes.upstream import TEXT, FakeUpstream

SECRET = b"host-only-secret-3f9a"


class _Secret(BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - the http.server hook's name
        _Secret.hits.append(self.path)
        self.send_response(200)
        self.send_header("content-length", str(len(SECRET)))
        self.end_headers()
        self.wfile.write(SECRET)

    def log_message(self, *args: object) -> None:
        pass


class _V6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


def _serve(server_cls: type[ThreadingHTTPServer], host: str, port: int) -> ThreadingHTTPServer:
    server = server_cls((host, port), _Secret)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def host_service():
    """A service on 127.0.0.1 and ::1 (same port), as a notebook or a Docker API would be."""
    for _ in range(20):
        v4 = _serve(ThreadingHTTPServer, "127.0.0.1", 0)
        port = v4.server_address[1]
        try:
            v6 = _serve(_V6Server, "::1", port)
        except OSError:
            v4.shutdown()
            continue
        yield port
        v4.shutdown()
        v6.shutdown()
        return
    raise RuntimeError("no port free on both 127.0.0.1 and ::1")


@pytest.fixture(scope="module")
def fake():
    with FakeUpstream() as f:
        yield f


# The agent: asks the proxy (from HTTP_PROXY, bypassing NO_PROXY on purpose) for each URL, and
# also tries a CONNECT tunnel, as a hostile agent would.
PROBE = r"""
import json, os, socket, sys, urllib.parse, urllib.request
proxy = os.environ["HTTP_PROXY"]
for var in ("NO_PROXY", "no_proxy"):  # urllib would otherwise go to loopback directly
    os.environ.pop(var, None)
opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy, "https": proxy}))
out = {}
for url in json.loads(sys.argv[1]):
    try:
        with opener.open(url, timeout=20) as r:
            out[url] = [r.status, r.read().decode("latin-1")]
    except urllib.error.HTTPError as e:
        out[url] = [e.code, e.read().decode("latin-1")]
    except Exception as e:
        out[url] = [None, repr(e)]
p = urllib.parse.urlsplit(proxy)
for target in json.loads(sys.argv[2]):
    s = socket.create_connection((p.hostname, p.port), timeout=20)
    s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    out["CONNECT " + target] = [int(s.recv(4096).split()[1]), ""]
    s.close()
json.dump(out, open("probe.json", "w"))
"""


def spellings(port: int) -> list[str]:
    return [
        f"http://127.0.0.1:{port}/a",
        f"http://localhost:{port}/b",
        f"http://LOCALHOST.:{port}/c",
        f"http://127.1:{port}/d",
        f"http://2130706433:{port}/e",
        f"http://0x7f000001:{port}/f",
        f"http://0177.0.0.1:{port}/g",
        f"http://0x7f.0.0.1:{port}/h",
        f"http://127.0.0.2:{port}/i",
        f"http://[::1]:{port}/j",
        f"http://[::ffff:127.0.0.1]:{port}/k",
        f"http://[::ffff:7f00:1]:{port}/l",
        f"http://0.0.0.0:{port}/m",
        f"http://0:{port}/n",
        f"http://[::]:{port}/o",
        # refused before any connection is made (never contacted):
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.1/",
        "http://192.168.1.1/",
        "http://172.17.0.1:2375/containers/json",
        "http://[fe80::1]/",
        "http://[fd00::1]/",
        "http://100.64.0.1/",
    ]


def test_every_spelling_of_a_host_destination_is_refused_recorded_and_audited(tmp_path, host_service, fake):
    store, ws = tmp_path / "store", tmp_path / "ws"
    ws.mkdir()
    (ws / "probe.py").write_text(PROBE)
    port = host_service
    urls = spellings(port)
    own = sorted(str(a) for a in own_addresses() if not a.is_loopback)
    urls += [f"http://{a if ':' not in a else f'[{a}]'}:{port}/own" for a in own]
    _Secret.hits.clear()
    res = amb_record(
        store,
        fake.url,
        [sys.executable, "probe.py", json.dumps(urls), json.dumps([f"127.0.0.1:{port}", f"[::1]:{port}"])],
        cwd=ws,
    )
    assert res.returncode == 0, res.stderr
    got = json.loads((ws / "probe.json").read_text())
    reached = {url: body for url, (status, body) in got.items() if status != 403}
    assert reached == {}, reached
    assert all(
        "amb-record refused" in body for url, (_, body) in got.items() if not url.startswith("CONNECT")
    )
    assert _Secret.hits == []  # nothing reached the host's service
    rows = sql(store, "SELECT method, host, port, status, blocked FROM network_requests ORDER BY seq")
    assert len(rows) == len(got)
    assert all(r["status"] == 403 and r["blocked"] for r in rows)
    by_host = {r["host"]: r["blocked"] for r in rows}
    assert "loopback" in by_host["2130706433"] and "127.0.0.1" in by_host["2130706433"]
    assert "link-local" in by_host["169.254.169.254"]
    assert "private" in by_host["10.0.0.1"]
    assert "IPv6" in by_host["::ffff:127.0.0.1"]
    assert [r["method"] for r in rows].count("CONNECT") == 2
    audit = _amb_json(store, "audit", res.stdout.strip().splitlines()[-1])
    blocked = [v for v in audit["violations"] if v["rule"] == "blocked_destination"]
    assert len(blocked) == len(got) and all(len(v["events"]) == 1 for v in blocked), audit


def test_allowed_host_and_configured_upstream_on_loopback_still_work(tmp_path, host_service, fake):
    store, ws = tmp_path / "store", tmp_path / "ws"
    ws.mkdir()
    (ws / "probe.py").write_text(PROBE)
    port = host_service
    urls = [f"http://127.0.0.1:{port}/allowed", f"http://[::1]:{port}/not-listed", f"{fake.url}/bytes/5"]
    _Secret.hits.clear()
    res = amb_record(
        store,
        fake.url,
        [sys.executable, "probe.py", json.dumps(urls), "[]"],
        cwd=ws,
        extra=["--allow-host", f"127.0.0.1:{port}"],
    )
    assert res.returncode == 0, res.stderr
    got = json.loads((ws / "probe.json").read_text())
    assert got[urls[0]] == [200, SECRET.decode()]
    assert got[urls[1]][0] == 403  # the same service at an address that was not allowed
    assert got[urls[2]] == [200, "xxxxx"]  # the configured upstream, through the regular proxy
    assert _Secret.hits == ["/allowed"]
    # and the reverse endpoint's model call to the loopback upstream:
    res = amb_record(
        store,
        fake.url,
        [
            "sh",
            "-c",
            'curl -sS "$OPENAI_BASE_URL/chat/completions" -H "authorization: Bearer $OPENAI_API_KEY" '
            '-H \'content-type: application/json\' -d \'{"model": "m", "messages": []}\'',
        ],
        cwd=ws,
    )
    assert res.returncode == 0 and TEXT.split(":")[0] in res.stdout, res.stderr


def test_allow_host_rejects_a_malformed_value(tmp_path, fake):
    res = amb_record(tmp_path / "s", fake.url, ["true"], cwd=tmp_path, extra=["--allow-host", "nohost"])
    assert res.returncode == 2 and "--allow-host 'nohost'" in res.stderr and "Traceback" not in res.stderr


# -- the policy on its own -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "addr, word",
    [
        ("127.0.0.1", "loopback"),
        ("127.255.0.9", "loopback"),
        ("::1", "loopback"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:10.1.2.3", "private"),
        ("64:ff9b::a00:1", "private"),  # NAT64 of 10.0.0.1
        ("2002:7f00:1::", "loopback"),  # 6to4 of 127.0.0.1
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("10.0.0.1", "private"),
        ("172.16.5.4", "private"),
        ("192.168.0.1", "private"),
        ("fd00::2", "private"),
        ("100.64.0.1", "global"),
        ("224.0.0.1", "multicast"),
        ("240.0.0.1", "private"),  # Python files the reserved 240/4 under private
    ],
)
def test_non_global_addresses_are_refused(addr, word):
    reason = why_blocked(ipaddress.ip_address(addr))
    assert reason is not None and word in reason


def test_global_addresses_pass_unless_they_are_this_hosts():
    assert why_blocked(ipaddress.ip_address("93.184.216.34")) is None
    assert why_blocked(ipaddress.ip_address("2606:4700::1111")) is None
    mine = ipaddress.ip_address("93.184.216.34")
    assert "this host" in (why_blocked(mine, frozenset({mine})) or "")


def test_a_name_is_resolved_once_and_the_answer_pinned(monkeypatch):
    answers = iter([["93.184.216.34"], ["127.0.0.1"]])  # a rebinding DNS server's two answers

    async def resolve(self, host, port, **kw):
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in next(answers)]

    monkeypatch.setattr(asyncio.BaseEventLoop, "getaddrinfo", resolve)
    dest = Destinations([], own=frozenset())

    async def twice():
        return await dest.verdict("rebind.example", 80), await dest.verdict("REBIND.example.", 80)

    first, second = asyncio.run(twice())
    assert first.address == second.address == "93.184.216.34" and first.blocked is None


def test_host_port_parsing():
    assert parse_host_port("Example.COM:8080") == ("example.com", 8080)
    assert parse_host_port("[::1]:9") == ("::1", 9)
    # A port in digits of another script ("٨٠" is 80 to int()) is not a port a URL can name.
    for bad in ("nohost", ":80", "h:0", "h:x", "h:70000", "h:²", "h:٨٠"):
        with pytest.raises(ValueError):
            parse_host_port(bad)


def _amb_json(store, *args):
    from tests.amb.test_record_cli import amb

    r = amb(store, *args, "--json")
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)
