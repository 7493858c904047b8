# Recipes. Run them through ./just, which sets up .venv first.

# List the recipes
default:
    @just --list

# The main job: record sample runs, score them, show, verify and query them (`amb demo`)
[positional-arguments]
demo *args:
    amb demo "$@"

# Run the test suite (pytest arguments pass through)
[positional-arguments]
test *args:
    bash scripts/test.sh "$@"

# Lint, format check and type check (also the first step of a bare `./just test`)
lint:
    bash scripts/lint.sh

# Benchmarks (slow; not part of the tests); arguments reach the bench as given, quoted ones whole
[positional-arguments]
bench name *args:
    #!/usr/bin/env bash
    shift
    exec python "bench/{{name}}.py" "$@"

# Rewrite the generated parts of the docs: the README's views and performance tables, docs/cli.md
docs:
    python scripts/docs.py
