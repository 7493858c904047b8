#!/usr/bin/env bash
# The test command (`./just test`); .ci/run starts the services the tests need (dockerd, Chromium).
# With no arguments it is the whole check, as CI runs it: ruff, then every test in three processes
# with mypy beside them; it fails if any of them fails. With arguments they go to pytest alone, in
# one process (`./just test tests/replay -k verify`).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -eq 0 ]; then
    # The agents' own environment (.venv-agents: the newest SDKs, node packages) takes minutes on a
    # fresh clone: it is made in the background while the lint runs; a test that needs it before it is
    # ready waits on its lock (tests/fakes/agents.py), and a failure here fails that test, not this line.
    mkdir -p .venv-agents
    python tests/fakes/agents.py >.venv-agents/make.log 2>&1 &
    bash scripts/lint.sh --fast
    # mypy takes minutes without its cache: it runs beside the tests at the lowest CPU priority, taking
    # only what they leave idle (they mostly wait on containers); its verdict follows theirs.
    mkdir -p .lint
    echo "lint: mypy (beside the tests; its output follows theirs)" >&2
    nice -n 19 mypy . >.lint/mypy.log 2>&1 &
    mypy_pid=$!
    # Three processes on two cores: the tests mostly wait (AMB_TEST_WORKERS changes the count). A test
    # file stays in one process (its module fixtures); the files marked `long` go first, in the order
    # tests/conftest.py gives them (xdist's own reorder would put them last).
    tests=0
    python -m pytest -p no:cacheprovider -n "${AMB_TEST_WORKERS:-3}" --dist loadfile --no-loadscope-reorder --durations=15 \
        || tests=$?
    mypy_status=0
    wait "$mypy_pid" || mypy_status=$?
    echo "lint: mypy" >&2
    cat .lint/mypy.log >&2
    if [ "$mypy_status" -ne 0 ]; then
        echo "lint: mypy failed (exit $mypy_status)" >&2
        exit 1
    fi
    exit "$tests"
fi
exec python -m pytest -p no:cacheprovider "$@"
