#!/usr/bin/env bash
# Installs headless Chromium for the HTML report test (tests/scorer/test_report_html.py).
# Debian's package; nothing is fetched from anywhere but the Debian mirrors.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
