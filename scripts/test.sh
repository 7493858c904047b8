#!/usr/bin/env bash
# The test command (`./just test`). Services the tests need are started by .ci/run (dockerd,
# Chromium); everything else (loopback upstreams, proxies, model servers) the tests start themselves.
#
# With no arguments it is the whole check, as CI runs it: lint (ruff) and the format check, then every
# test, in three processes (pytest-xdist), with the type check (mypy; configuration in pyproject.toml)
# running beside them; it fails if any of them fails.
# With arguments they go to pytest alone, in one process (`./just test tests/replay -k verify`; add
# `-n 2` for two); `./just lint` runs the first three on their own.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -eq 0 ]; then
    # The agents' own environment (.venv-agents: the newest SDKs, node packages) takes minutes on a
    # fresh clone: it is made in the background while the lint runs; a test that needs it before it is
    # ready waits on its lock (tests/fakes/agents.py), and a failure here fails that test, not this line.
    mkdir -p .venv-agents
    python tests/fakes/agents.py >.venv-agents/make.log 2>&1 &
    bash scripts/lint.sh --fast
    # The type check takes two minutes on a fresh clone (no mypy cache): it runs beside the tests, at
    # the lowest CPU priority so that it only takes what the tests leave idle (they mostly wait on
    # containers), and its verdict is given after theirs. Either failing fails the command.
    mkdir -p .lint
    echo "lint: mypy (beside the tests; its output follows theirs)" >&2
    nice -n 19 mypy . >.lint/mypy.log 2>&1 &
    mypy_pid=$!
    # Three test processes on two cores: much of the suite's time is spent waiting on containers,
    # subprocesses and loopback servers, not computing (AMB_TEST_WORKERS changes the count). A test file
    # stays in one process (its module fixtures: the fake upstream, a recording proxy per process). The
    # files marked `long` go first, in the order tests/conftest.py gives them (xdist's own reorder would
    # put them last).
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
