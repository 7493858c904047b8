#!/usr/bin/env bash
# The test command (`./just test`). Services the tests need are started by .ci/run (dockerd,
# Chromium); everything else (loopback upstreams, proxies, model servers) the tests start themselves.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python -m pytest -p no:cacheprovider "$@"
