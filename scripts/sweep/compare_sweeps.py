"""Whether an engine change kept the architecture sweep's verdicts: two sweep results, compared.

    python scripts/sweep/compare_sweeps.py NEW.jsonl [--against docs/architectures.jsonl]

For every audit (type, task, attention implementation) in NEW that the other file also
holds, it prints each suite whose status differs, with the check that decided it on each
side, and exits 1 if any does. An audit built on one side only is listed too. Run the
sweep of the changed engine into a file of its own (``architecture_sweep.py --out
NEW.jsonl``, with ``--types`` for the types whose verdicts are at stake), then this.
"""

from __future__ import annotations

import argparse
from pathlib import Path

# this folder is on the path of every script run from it
from render_architectures import latest

DEFAULT = Path(__file__).resolve().parents[2] / "docs" / "architectures.jsonl"


def differences(new: dict, old: dict) -> list[str]:
    if bool(new.get("built")) != bool(old.get("built")):
        return [f"built {bool(old.get('built'))} -> {bool(new.get('built'))} ({new.get('error') or old.get('error')})"]
    moved = []
    for suite, before in old.get("suites", {}).items():
        after = new.get("suites", {}).get(suite)
        if after is None:
            continue  # a suite the new run did not audit (--suites)
        if after["status"] != before["status"]:
            moved.append(
                f"{suite}: {before['status']} ({before.get('check')}) -> {after['status']} ({after.get('check')})"
            )
    return moved


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("new", type=Path, help="the sweep results of the changed engine (JSON lines)")
    parser.add_argument("--against", type=Path, default=DEFAULT, help=f"the recorded results (default: {DEFAULT.name})")
    args = parser.parse_args()
    for path in (args.new, args.against):
        if not path.is_file():
            parser.error(f"no such file: {path}")
    new, old = latest(args.new), latest(args.against)
    shared = [key for key in new if key in old]
    changed = 0
    for key in shared:
        moved = differences(new[key], old[key])
        if moved:
            changed += 1
            print(f"{' '.join(key)}: {'; '.join(moved)}")
    kept, unrecorded = len(shared) - changed, len(new) - len(shared)
    print(f"{kept} of {len(shared)} audits kept every suite's status ({unrecorded} not recorded)")
    return 1 if changed else 0


if __name__ == "__main__":
    raise SystemExit(main())
