# Recipes. Run them through ./just, which sets up .venv first.

# List the recipes
default:
    @just --list

# The main job: record sample runs, score them, show, verify and query them (`amb demo`)
demo *args:
    amb demo {{args}}

# Run the test suite (pytest arguments pass through)
test *args:
    bash scripts/test.sh {{args}}

# Lint, format check and type check (also the first step of a bare `./just test`)
lint:
    bash scripts/lint.sh

# Benchmarks (slow; not part of the tests)
bench name *args:
    python bench/{{name}}.py {{args}}

# Rewrite the generated parts of the docs: the README's views and performance tables, docs/cli.md
docs:
    python scripts/docs.py
