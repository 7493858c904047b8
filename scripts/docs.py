"""Keep the README's generated block in step with the code: `./just docs` rewrites it.

The block between the ``views: begin`` and ``views: end`` markers is ``amb schema --format md``
(the SQL views' columns, from ``replay/views.py``); tests/test_docs.py fails when the two differ.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from replay import views

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"(<!-- views: begin[^\n]*-->\n)(.*?)(\n<!-- views: end -->)", re.S)


def generated() -> str:
    return "\n" + views.markdown().strip() + "\n"


def current(text: str) -> str:
    m = BLOCK.search(text)
    if m is None:
        raise SystemExit(f"{README}: no views block (<!-- views: begin ... --> ... <!-- views: end -->)")
    return m.group(2)


def main() -> int:
    text = README.read_text()
    current(text)  # fails clearly if the markers are gone
    new = BLOCK.sub(lambda m: m.group(1) + generated() + m.group(3), text)
    if new != text:
        README.write_text(new)
        print(f"{README.name}: views block rewritten")
    else:
        print(f"{README.name}: views block already current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
