"""Isolation you can prove: what the agent container cannot see, reach or keep.

One recorded docker run executes a probe as the agent. From inside, it looks for the private
references (mounts, files, the network), the real API key (environment, files, the memory of every
process it can read), the store and the spool, the docker socket, and every port the host listens
on; it also tries direct egress around the proxy. The probe's findings come back in the sealed
submission; the shim's own record of the egress attempt comes from the spool.

Needs dockerd (CI starts it with .ci/dockerd.sh); never skipped.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import textwrap
from pathlib import Path

from recorder.docker_backend import DockerBackend
from recorder.run import RunSpec, parse_upstreams, record
from schemas.blobstore import BlobStore
from tests.fakes.upstream import FakeUpstream
from tests.recorder.shim_helpers import payloads, shim_events

PROBE = textwrap.dedent(r"""
    import json, os, re, socket, subprocess, sys, urllib.request
    from concurrent.futures import ThreadPoolExecutor
    from urllib.parse import urlsplit

    # Secrets arrive reversed, so that this probe's own argv does not contain them.
    args = json.loads(sys.argv[1])
    secrets_ = {k: v[::-1].encode() for k, v in args["reversed"].items()}
    me = os.getpid()
    found = {k: [] for k in secrets_}

    def look(where, data):
        for k, token in secrets_.items():
            if token in data:
                found[k].append(where)

    # 1. files: every readable regular file outside /proc, /sys, /dev
    scanned = 0
    for root, dirs, files in os.walk("/"):
        if root in ("/proc", "/sys", "/dev"):
            dirs[:] = []
            continue
        for name in files:
            path = os.path.join(root, name)
            try:
                if os.path.islink(path) or os.path.getsize(path) > 64 << 20:
                    continue
                with open(path, "rb") as f:
                    look(path, f.read())
                scanned += 1
            except OSError:
                pass

    # 2. processes: environment, argv, and the memory of every process we may read (not ours)
    mem_read = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == me:
            continue
        for part in ("environ", "cmdline"):
            try:
                look(f"/proc/{pid}/{part}", open(f"/proc/{pid}/{part}", "rb").read())
            except OSError:
                pass
        try:
            maps = open(f"/proc/{pid}/maps").read().splitlines()
            with open(f"/proc/{pid}/mem", "rb", 0) as mem:
                for line in maps:
                    addr, perms = line.split()[:2]
                    if not perms.startswith("r"):
                        continue
                    lo, hi = (int(x, 16) for x in addr.split("-"))
                    try:
                        mem.seek(lo)
                        look(f"/proc/{pid}/mem", mem.read(hi - lo))
                        mem_read += hi - lo
                    except (OSError, OverflowError, ValueError):
                        pass
        except OSError:
            pass
    look("env", "\0".join(f"{k}={v}" for k, v in os.environ.items()).encode())

    # 3. the network: every port the host listens on, at this network's gateway and docker0's
    proxy = urlsplit(os.environ["OPENAI_BASE_URL"])
    gateway = proxy.hostname
    # every endpoint amb-record gave the agent (one per upstream, and the regular proxy)
    proxy_ports = {urlsplit(v).port for v in os.environ.values() if v.startswith(f"http://{gateway}:")}

    def tcp(host, port, timeout=3.0):
        s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        s.settimeout(timeout)
        try:
            s.connect((host, port))
            return "open"
        except OSError as e:
            return type(e).__name__ + ":" + (os.strerror(e.errno) if e.errno else str(e))
        finally:
            s.close()

    targets = [(h, p) for h in (gateway, args["docker0"]) for p in args["host_ports"]]
    with ThreadPoolExecutor(32) as pool:
        reach = dict(zip([f"{h}:{p}" for h, p in targets], pool.map(lambda t: tcp(*t), targets)))

    # 4. direct egress around the proxy
    direct = {
        "tcp 1.1.1.1:443": tcp("1.1.1.1", 443),
        "tcp 8.8.8.8:53": tcp("8.8.8.8", 53),
    }
    try:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        opener.open("http://example.com/", timeout=5)
        direct["http example.com"] = "open"
    except Exception as e:
        direct["http example.com"] = type(e).__name__

    def listable(path):
        try:
            return os.listdir(path)
        except OSError as e:
            return type(e).__name__

    result = {
        "found": found, "scanned_files": scanned, "memory_bytes_read": mem_read,
        "exists": {
            p: os.path.exists(p)
            for p in ["/data/private", "/eval", "/results", "/var/run/docker.sock", "/run/docker.sock",
                      args["store"], args["data_private"]]
        },
        "mounts": open("/proc/self/mountinfo").read(),
        "sock_dir": listable("/run/amb/sock"),
        "data_public": listable("/data/public"),
        "gateway": gateway, "proxy_ports": sorted(proxy_ports), "reach": reach, "direct": direct,
        "uid": os.getuid(), "key_in_env": os.environ.get("OPENAI_API_KEY"),
    }
    open("/workspace/isolation.json", "w").write(json.dumps(result))
""")


def _host_listening_ports() -> set[int]:
    """TCP ports something on this host listens on at a non-loopback address."""
    ports = set()
    loopback = ("0100007F", "00000000000000000000000001000000")  # 127.0.0.1 and ::1, as /proc shows them
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            addr, port = fields[1].split(":")
            if fields[3] == "0A" and addr not in loopback:  # 0A: LISTEN
                ports.add(int(port, 16))
    return ports


def test_agent_container_isolation(tmp_path: Path, agent_image: str) -> None:
    real_key = "sk-real-isolation-" + secrets.token_hex(16)
    private_token = "PRIVATE-REFERENCE-" + secrets.token_hex(16)
    data = tmp_path / "data"
    (data / "public" / "case_1").mkdir(parents=True)
    (data / "public" / "case_1" / "ct.bin").write_bytes(b"public input")
    (data / "private" / "case_1").mkdir(parents=True)
    (data / "private" / "case_1" / "organ.bin").write_bytes(private_token.encode())
    store = tmp_path / "store"

    # A stand-in for anything of ours that might listen on all interfaces (a store server, a grader
    # service, a recorder control port): the container must not reach it.
    sentinel = socket.socket()
    sentinel.bind(("0.0.0.0", 0))
    sentinel.listen(8)
    sentinel_port = sentinel.getsockname()[1]

    backend = DockerBackend(agent_image)
    args = {}

    def on_ready(ports, env):
        args.update(
            {
                # The placeholder key is a control: it IS in the agent's environment and memory, so
                # the probe must find it there, or its search proves nothing.
                "reversed": {
                    "key": real_key[::-1],
                    "private": private_token[::-1],
                    "placeholder": env["OPENAI_API_KEY"][::-1],
                },
                "host_ports": sorted(_host_listening_ports() | {sentinel_port} | set(ports.values())),
                "docker0": "172.17.0.1",
                "store": str(store.resolve()),
                "data_private": str((data / "private").resolve()),
            }
        )

    try:
        with FakeUpstream() as upstream:
            # The argv is fixed before on_ready runs, so the probe gets its arguments from a file
            # the test writes into the workspace through a tiny launcher.
            launcher = (
                "import json,subprocess,sys;"
                "a=open('/workspace/probe_args.json').read();"
                "sys.exit(subprocess.run([sys.executable,'-c',sys.argv[1],a]).returncode)"
            )

            def ready(ports, env):
                on_ready(ports, env)
                assert backend.workspace is not None
                (backend.workspace / "probe_args.json").write_text(json.dumps(args))
                os.chmod(backend.workspace / "probe_args.json", 0o644)

            outcome = record(
                RunSpec(
                    argv=["python3", "-c", launcher, PROBE],
                    store=store,
                    run_id="isolation",
                    data_dir=data,
                    upstreams=parse_upstreams([f"openai={upstream.url}"]),
                    env={"OPENAI_API_KEY": real_key},
                    time_limit_s=240,
                ),
                backend,
                on_ready=ready,
            )
    finally:
        sentinel.close()
    assert outcome.status == "completed", outcome

    recorder_events = shim_events(store, "isolation", source="recorder")
    (sealed,) = payloads(recorder_events, "submission.sealed")
    (started,) = payloads(recorder_events, "run.started")
    files = {f.path: f for f in sealed.files}
    result = json.loads(BlobStore(store / "blobs").get(files["isolation.json"].content))

    # The probe really looked.
    assert result["scanned_files"] > 1000 and result["memory_bytes_read"] > 1 << 20
    assert result["uid"] != 0
    assert "env" in result["found"]["placeholder"]
    assert any(w.endswith("/environ") for w in result["found"]["placeholder"])
    assert any(w.endswith("/mem") for w in result["found"]["placeholder"])

    # Private references: not mounted, not anywhere in the container, not on any path.
    assert result["found"]["private"] == []
    assert not any(result["exists"][p] for p in ("/data/private", "/eval", "/results", args["data_private"]))
    assert str(data / "private") not in result["mounts"]
    assert result["data_public"] == ["case_1"]

    # The real API key: not in the environment, files or readable process memory.
    assert result["found"]["key"] == []
    assert result["key_in_env"] and result["key_in_env"] != real_key

    # The store, the spool and docker itself are out of reach.
    assert not result["exists"][str(store.resolve())]
    assert str(store.resolve()) not in result["mounts"]
    assert not result["exists"]["/var/run/docker.sock"] and not result["exists"]["/run/docker.sock"]
    assert result["sock_dir"] == "PermissionError"  # the shim's socket directory; the socket is gone anyway

    # Only the proxy answers on the host; nothing else we (or anyone) run there is reachable.
    assert started.tool_versions.get("host_firewall") == "on", "the host firewall must be on under root"
    gateway = result["gateway"]
    open_ = sorted(k for k, v in result["reach"].items() if v == "open")
    assert open_ == sorted(f"{gateway}:{p}" for p in result["proxy_ports"]), result["reach"]
    assert result["reach"][f"{gateway}:{sentinel_port}"] != "open"
    assert result["reach"][f"172.17.0.1:{sentinel_port}"] != "open"

    # Direct egress around the proxy fails ...
    assert all(v != "open" for v in result["direct"].values()), result["direct"]
    # ... and is on the record, as the shim saw it.
    attempts = [
        (r.host, r.port, r.error) for r in payloads(shim_events(store, "isolation"), "network.request")
    ]
    assert any(h == "1.1.1.1" and p == 443 and e for h, p, e in attempts), attempts
    assert any(h == "8.8.8.8" and p == 53 and e for h, p, e in attempts), attempts
