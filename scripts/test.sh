#!/usr/bin/env bash
# The test command (`./just test`). Services the tests need are started by .ci/run (dockerd,
# Chromium); everything else (loopback upstreams, proxies, model servers) the tests start themselves.
#
# With no arguments it is the whole check, as CI runs it: lint (ruff), the format check, the type
# check (mypy; configuration in pyproject.toml), then every test. With arguments they go to pytest
# alone (`./just test tests/replay -k verify`); `./just lint` runs the first three on their own.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -eq 0 ]; then
    bash scripts/lint.sh
fi
exec python -m pytest -p no:cacheprovider "$@"
