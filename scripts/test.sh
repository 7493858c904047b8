#!/usr/bin/env bash
# The test command: services the tests need are started by .ci/run (dockerd); everything
# else (loopback upstreams, proxies) is started by the tests themselves.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python -m pytest "$@"
