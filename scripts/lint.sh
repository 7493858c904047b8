#!/usr/bin/env bash
# Lint, format check and type check; fails on the first violation (`./just lint`).
# `lint.sh --fast` runs the two ruff checks only (a second or two): the bare test command runs those
# first and the type check beside the tests (scripts/test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
echo "lint: ruff check" >&2
ruff check --no-cache .
echo "lint: ruff format --check" >&2
ruff format --check --no-cache .
if [ "${1:-}" = "--fast" ]; then
    exit 0
fi
echo "lint: mypy" >&2
mypy .
