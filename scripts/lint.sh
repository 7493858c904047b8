#!/usr/bin/env bash
# Lint, format check and type check; fails on the first violation (`./just lint`).
set -euo pipefail
cd "$(dirname "$0")/.."
echo "lint: ruff check" >&2
ruff check --no-cache .
echo "lint: ruff format --check" >&2
ruff format --check --no-cache .
echo "lint: mypy" >&2
mypy .
