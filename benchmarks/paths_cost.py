"""What auditing the paths users run costs: this tree's audit against another revision's.

    python benchmarks/paths_cost.py [--baseline a5251a5] [--profiles dev,ci] [--runs 5]

For the tiny reference decoder and the tiny Hugging Face GPT-2 (both built from code
every revision since 0.2 has), each profile's audit of every suite runs in a process of
its own, this tree's and the baseline's alternating, ``--runs`` times each. The baseline
is checked out with ``git worktree`` into a temporary directory and imported ahead of the
installed package (the same interpreter, torch and transformers). Each process prints its
audit's wall time and the model forwards it made (a forward pre-hook on the model); the
table shows medians and the ratio this tree / baseline. One torch thread, as a
pytest-xdist worker; the machine should be otherwise idle.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time, warnings
warnings.filterwarnings("ignore")
import torch
torch.set_num_threads(1)
from maskcheck import audit
from maskcheck.harness.adapters.hf import HFAdapter
from maskcheck.harness.adapters.specs import adapter_for
from maskcheck.reference_models import PRESETS, Transformer
from maskcheck.reference_models.hf_tiny import tiny_model

name, profile = sys.argv[1], sys.argv[2]
if name == "tiny-reference":
    torch.manual_seed(0)
    model = Transformer(PRESETS["tiny-decoder"]).eval()
    adapter = adapter_for(model)
else:
    model = tiny_model("gpt2")
    adapter = HFAdapter(model)
forwards = [0]
model.register_forward_pre_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
started = time.perf_counter()
# the suites both revisions have: a suite added since is its own cost (docs/performance.md)
common = ["causal", "padding", "cross_attention", "loss_masking", "packing", "kv_cache", "norm_checkpoint"]
result = audit(adapter, common, profile=profile)
seconds = time.perf_counter() - started
cases = sum(s.cases for s in result.suites)
print(json.dumps({"seconds": seconds, "forwards": forwards[0], "cases": cases, "status": result.status}))
"""


def run(python_path: str | None, model: str, profile: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if python_path is not None:
        env["PYTHONPATH"] = python_path
    done = subprocess.run(
        [sys.executable, "-c", CHILD, model, profile],
        capture_output=True,
        text=True,
        env=env,
        cwd=tempfile.gettempdir(),
    )
    if done.returncode != 0:
        raise SystemExit(f"the audit of {model} ({profile}) failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def baseline_tree(revision: str, scratch: Path) -> str:
    """A directory whose ``maskcheck`` is ``revision``'s tree, for PYTHONPATH."""
    tree = scratch / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), revision], check=True,
                   capture_output=True)  # fmt: skip
    shadow = scratch / "shadow"
    package = shadow / "maskcheck"  # laid out as pyproject.toml's package-dir maps the folders
    package.mkdir(parents=True)
    for item in (tree / "maskcheck").iterdir():
        (package / item.name).symlink_to(item)
    for folder in ("harness", "suites", "reference_models"):
        (package / folder).symlink_to(tree / folder)
    # The revision's own entry points (its suites), found before the installed maskcheck's:
    # importlib.metadata takes the first distribution of a name on sys.path.
    project = tomllib.loads((tree / "pyproject.toml").read_text())["project"]
    info = shadow / f"maskcheck-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: maskcheck\nVersion: {project['version']}\n")
    groups = project.get("entry-points", {})
    (info / "entry_points.txt").write_text(
        "".join(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in points.items()) for group, points in groups.items())
    )
    return str(shadow)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="a5251a5", help="the revision to compare with (default: a5251a5)")
    parser.add_argument("--profiles", default="dev,ci")
    parser.add_argument("--models", default="tiny-reference,tiny-gpt2")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="maskcheck-bench-"))
    try:
        old = baseline_tree(args.baseline, scratch)
        print(f"{'model':<15} {'profile':<8} {'forwards':>17} {'cases':>13} {'seconds (median)':>22} {'ratio':>6}")
        worst = 0.0
        for model in args.models.split(","):
            for profile in args.profiles.split(","):
                new_runs, old_runs = [], []
                for _ in range(args.runs):  # alternating, so drift hits both sides alike
                    new_runs.append(run(None, model, profile))
                    old_runs.append(run(old, model, profile))
                new_s = statistics.median(r["seconds"] for r in new_runs)
                old_s = statistics.median(r["seconds"] for r in old_runs)
                ratio = new_s / old_s
                worst = max(worst, ratio) if profile == "ci" else worst
                forwards = f"{old_runs[0]['forwards']:>7} -> {new_runs[0]['forwards']:<7}"
                cases = f"{old_runs[0]['cases']:>5} -> {new_runs[0]['cases']:<5}"
                print(f"{model:<15} {profile:<8} {forwards} {cases} {old_s:>9.2f} -> {new_s:<9.2f} {ratio:>6.2f}")
        print(f"largest ci ratio: {worst:.2f} (target: at most 2)")
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(scratch / "tree")],
                       capture_output=True)  # fmt: skip
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
