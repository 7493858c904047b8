"""Fixtures shared across the test folders.

- ``fake``: the fake model provider on loopback (``tests/fakes/upstream.py``), one per test module;
- ``make_twin``: synthetic task twins, each made once per session;
- ``synthetic_store``: a new store of synthetic runs, ingested;
- the container tests' setup: a reachable dockerd and the agent and grader images (built once);
- a temp dir of the session's own, which must hold no amb entry when the session ends.

These tests never skip: CI starts dockerd first (.ci/dockerd.sh). Without a daemon they fail
with a message that says so. The image is found by content tag, so it is built only when the
Dockerfile, the shim or the base changed. The base comes from a debootstrapped Debian unless
AMB_BASE_IMAGE names a pullable one. Test workers running side by side (pytest-xdist) take turns
at the image step through one lock file, so an image is built once and the others find it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from amb.images import ImageError, docker_client, ensure_images
from recorder.synthetic import generate_run
from replay.ingest import ingest
from schemas.blobstore import BlobStore
from schemas.tempdirs import make_tempdir, remove_tempdir
from tasks.registry import load_spec
from tasks.synth import synth
from tests.fakes.upstream import FakeUpstream
from tests.sessions import one_worker_at_a_time


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "long(minutes): a test file that takes minutes; the longest are started first"
    )
    if not hasattr(config, "workerinput"):  # the controller of the test processes, or the only one
        config.stash[SESSION_TMP] = _session_temp_dir()


SESSION_TMP = pytest.StashKey[Path]()


def _session_temp_dir() -> Path:
    """A temp dir of this test session's own, for every process of it (the test processes inherit
    TMPDIR, and so do the recorders, execs and clusters they start): what the suite leaves behind
    is found there, apart from what other sessions on the machine make meanwhile in its temp dir.
    pytest's own folders (tmp_path) stay in the machine's temp dir, and kept."""
    base = tempfile.gettempdir()
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", base)
    # Named in this process's lock: should the session be killed, `amb gc` removes it.
    session_tmp = make_tempdir("amb-tests-")
    session_tmp.chmod(0o1777)  # like the machine's: some tests run amb as another user (nobody)
    os.environ["TMPDIR"] = str(session_tmp)
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    return session_tmp


@pytest.hookimpl(trylast=True)  # after xdist has stopped the test processes
def pytest_sessionfinish(session: pytest.Session) -> None:
    """The suite leaves no amb entry in the temp dir: whatever a test or the product left in the
    session's temp dir (a killed run's workspace, a lock file) fails the session, by name."""
    session_tmp = session.config.stash.get(SESSION_TMP, None)
    if session_tmp is None:
        return
    left = sorted(p.name for p in session_tmp.iterdir() if p.name.startswith("amb"))
    remove_tempdir(session_tmp)
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = f"the tests left {len(left)} amb entries in the temp dir: {', '.join(left)}"
        if reporter is not None:
            reporter.write("\n")
            reporter.write_line(f"FAILED (temp dir): {message}", red=True, bold=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Test files that take minutes (marked ``long``) run first, the longest first; the others after,
    in their order.

    The full test command runs the files in several processes, each file whole in one of them
    (scripts/test.sh). A file of minutes that starts last keeps one process busy after the others
    have run out of files; started first, it runs while the others work through the short ones.
    (xdist's own order, by number of tests, is turned off there: it put the cluster files, two tests
    each and minutes long, at the very end.) The minutes are rough, measured on a loaded machine:
    only their order matters."""

    def minutes(item: pytest.Item) -> float:
        mark = item.get_closest_marker("long")
        return float(mark.kwargs.get("minutes", 1)) if mark is not None else 0.0

    items.sort(key=lambda item: -minutes(item))


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeUpstream]:
    """The fake provider (OpenAI and Anthropic wire formats) on 127.0.0.1, for one test module."""
    with FakeUpstream() as f:
        yield f


@pytest.fixture(scope="session")
def make_twin(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, int, int], Path]:
    """``make_twin(task, cases, seed)``: a synthetic twin of the task (``public/``, ``private/``).

    Made once per session for each (task, cases, seed) and shared: tests read it, never write in it.
    """
    made: dict[tuple[str, int, int], Path] = {}

    def make(task: str, cases: int, seed: int) -> Path:
        key = (task, cases, seed)
        if key not in made:
            root = tmp_path_factory.mktemp(f"twin-{task}-{cases}-{seed}")
            synth(load_spec(task), root, cases=cases, seed=seed)
            made[key] = root
        return made[key]

    return make


@pytest.fixture(scope="session")
def synthetic_store(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, int, int], Path]:
    """``synthetic_store(name, runs, calls)``: a new store (its own folder, named after ``name``) of
    ``runs`` synthetic runs ``run-0`` ... (seed = the number, ``calls`` model calls each), ingested."""

    def make(name: str, runs: int, calls: int) -> Path:
        root = tmp_path_factory.mktemp(name) / "store"
        blobs = BlobStore(root / "blobs")  # held throughout: the runs share one pack, as `amb generate`'s do
        for i in range(runs):
            generate_run(root, f"run-{i}", seed=i, calls=calls)
        blobs.close()
        ingest(root)
        return root

    return make


def require_docker() -> Any:
    try:
        return docker_client()
    except ImageError as e:
        pytest.fail(f"the container tests need dockerd: {e}", pytrace=False)


def _image(tmp_path_factory: pytest.TempPathFactory, role: str) -> str:
    require_docker()
    from_rootfs = not os.environ.get("AMB_BASE_IMAGE")
    with one_worker_at_a_time(tmp_path_factory, "amb-images"):
        return ensure_images((role,), from_rootfs=from_rootfs)[role].tag


@pytest.fixture(scope="session")
def agent_image(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _image(tmp_path_factory, "agent")


@pytest.fixture
def gc_alone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Held for the test: ``amb gc`` removes every dead run's container on the engine whose lock file
    is gone, another test's included. The tests that run it, or that leave a dead run's container for
    their own gc to find, hold this lock (shared by the session's workers) so that no other test's gc
    takes what they are about to look for."""
    with one_worker_at_a_time(tmp_path_factory, "amb-gc"):
        yield


@pytest.fixture(scope="session")
def docker_cli() -> Any:
    return require_docker()


@pytest.fixture(scope="session")
def grader_image(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _image(tmp_path_factory, "grader")


@pytest.fixture
def memory_growth(monkeypatch) -> list[int]:
    """Each time a bounded database memory limit is doubled (``replay.bounded``: a query ran short
    and is run again), the limit it had: a test that starts the limit small checks it was reached."""
    from replay import bounded

    grew: list[int] = []
    grow = bounded.DatabaseMemory.grow

    def counted(memory: bounded.DatabaseMemory) -> bool:
        grew.append(memory.limit)
        return grow(memory)

    monkeypatch.setattr(bounded.DatabaseMemory, "grow", counted)
    return grew
