"""Write the `--help` of every maskcheck command into docs/cli.md (between its markers).

python scripts/cli_reference.py           # rewrite the section
python scripts/cli_reference.py --check   # exit 1 if docs/cli.md is out of date (the tests run this)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "cli.md"
BEGIN, END = "<!-- help: begin (scripts/cli_reference.py) -->", "<!-- help: end -->"


def reference() -> str:
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: a fixed width keeps the file stable
    from maskcheck.harness.cli import build_parser

    parser = build_parser()
    sections = [("maskcheck", parser.format_help())]
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sections += [(f"maskcheck {name}", sub.format_help()) for name, sub in commands.choices.items()]
    body = "\n".join(f"### `{title}`\n\n```\n{text.rstrip()}\n```\n" for title, text in sections)
    return f"{BEGIN}\n{body}{END}"


def main() -> int:
    text = DOC.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    updated = text[:start] + reference() + text[end:]
    if "--check" in sys.argv:
        if updated != text:
            print(f"{DOC} is out of date: run python scripts/cli_reference.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(updated)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
