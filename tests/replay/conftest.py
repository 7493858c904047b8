from __future__ import annotations

import shutil

import pytest

from recorder.synthetic import generate_run
from replay.blob_migrate import migrate
from replay.ingest import ingest
from replay.store import Store
from schemas.blobstore import BlobStore
from tests.fakes.old_store import explode, plain_payloads
from tests.sessions import one_worker_at_a_time, shared_tmp


@pytest.fixture(scope="session")
def store_templates(tmp_path_factory):
    """The two stores of ``store``, built once; each test gets its own copy."""
    templates = {}
    for kind in ("packed", "migrated"):
        root = tmp_path_factory.mktemp(kind) / "store"
        for i in range(3):
            generate_run(root, f"run-{i}", seed=i, calls=12)
        ingest(root)
        blobs = BlobStore(root / "blobs")
        if kind == "migrated":
            assert explode(blobs) > 0
            done = migrate(blobs)
            assert done.bad == [] and done.packed > 0 and list(blobs.loose_files()) == []
            plain_payloads(root)  # and its events table as it was before the payload was zstd'd
            Store.open(root).close()
        blobs.close()
        templates[kind] = root
    return templates


@pytest.fixture(params=["packed", "migrated"])
def store(tmp_path, request, store_templates):
    """A store with three synthetic runs, ingested: as written today (blobs in packs), and as an
    old store of loose blob files brought to packs by ``amb blobs migrate`` (and its events table
    rebuilt by ``core.m006_payload_zstd``)."""
    root = tmp_path / "store"
    shutil.copytree(store_templates[request.param], root, symlinks=True)
    return root


@pytest.fixture(scope="session")
def viewer_store(tmp_path_factory):
    """Real recorded, synthetic, big and hostile runs, ingested and scored (tests/replay/viewer_store.py).

    Built once per test session, in the folder its test processes share: the first process that
    needs it builds it there, the others read what it saved. Every test reads the store as it is
    (read-only, as the viewer does) or copies it before changing anything."""
    from tests.replay.viewer_store import build, load, save

    with one_worker_at_a_time(tmp_path_factory, "viewer-store"):
        base = shared_tmp(tmp_path_factory) / "viewer-store"
        saved = base / "viewer-store.json"
        if saved.exists():
            return load(saved)
        shutil.rmtree(base, ignore_errors=True)  # what a build that failed in another process left
        base.mkdir()
        built = build(base)
        save(built, saved)
        return built


@pytest.fixture(scope="session")
def viewer(viewer_store):
    """`amb serve` over that store, on a loopback port, for the session."""
    from replay.web.server import Running

    with Running(viewer_store.root) as running:
        yield running


@pytest.fixture(scope="session")
def genai_run(tmp_path_factory):
    """The google-genai agent (tests/fakes/agents/genai_agent.py, the newest SDK: function calls
    streamed and not, countTokens, an inline PNG) recorded by amb-record against the fake Gemini API,
    which stays up for the session (so a test can tell that nothing more reached it)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    from tests.fakes.agents import agents_python
    from tests.fakes.harness import REAL_KEYS
    from tests.fakes.upstream import FakeUpstream

    root = tmp_path_factory.mktemp("genai")
    store, ws = root / "store", root / "ws"
    ws.mkdir()
    agent = Path(__file__).parents[1] / "fakes" / "agents" / "genai_agent.py"
    with FakeUpstream(prefix="/google") as fake:
        proc = subprocess.run(
            [str(Path(sys.executable).parent / "amb-record"), "--store", str(store)]
            + ["--upstream", f"gemini={fake.url}/google", "--", str(agents_python()), str(agent)],
            cwd=ws,
            env={**os.environ, **REAL_KEYS, "GENAI_KEY_OUT": str(root / "key")},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        yield SimpleNamespace(
            store=store,
            run_id=proc.stdout.strip().splitlines()[-1],
            workspace=ws,
            client=json.loads((ws / "client.json").read_text()),
            fake=fake,
        )
