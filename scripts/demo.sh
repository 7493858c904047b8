#!/usr/bin/env bash
# The main job (`./just demo`). Placeholder until the baseline agent lands: synthetic runs through
# the real spool -> ingest path, then verify, list, show and query them.
set -euo pipefail
cd "$(dirname "$0")/.."
store="${AMB_STORE:-out/demo-store}"
rm -rf "$store"
amb generate --store "$store" --runs 5
amb ingest --store "$store"
amb verify --store "$store"
amb runs --store "$store"
amb show --store "$store" synth-0000
amb sql --store "$store" "SELECT run_id, model, count(*) AS calls, sum(input_tokens) AS tokens_in, sum(output_tokens) AS tokens_out FROM model_calls GROUP BY ALL ORDER BY run_id"
