"""maskcheck's ``quick`` profile and the closest peer on the same seeded bugs and clean models.

    python benchmarks/peer_catalogue.py --peer .peer/bin/python [--profile quick] [--only NAME,...]

The models are those of ``scripts/mutation_score.py``: every seeded bug of
``reference_models/mutants.py`` and every clean model it scores. Each is one factory of a
generated module, and each tool runs on it as a user runs it, one process a model,
alternating: ``maskcheck audit module:peer_models:FACTORY --profile quick`` (every suite),
and pytest-torch's zero-code run ``pytest --torch-model=peer_models:FACTORY`` in its own
venv (``benchmarks/setup_peer.sh``).

What counts, for each tool:

- maskcheck catches a seeded bug when the check the bug was made for fails (the mutation
  score's rule);
- the peer catches one when one of its tests fails on the bug and passes on the bug's
  clean twin (the same model without the bug): the peer fails some clean models outright,
  and a failure that the clean twin shares is not about the bug;
- seconds are each tool's runs on the catalogue's models (the peer's runs on the clean twins,
  which only attribute its failures, are not counted);
- a false positive is a clean model on which the tool fails anything (maskcheck: a check
  that fails, errors or does not run; the peer: a test that fails or errors).

The peer's venv gets maskcheck's model code through a folder on its ``PYTHONPATH`` holding
a ``maskcheck`` package of links to ``harness/``, ``suites/`` and ``reference_models/``, so
it imports the same factories without installing maskcheck (or its pytest plugin) there.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from maskcheck.harness.engine.profile_names import PROFILE_NAMES
from maskcheck.reference_models import PRESETS
from maskcheck.reference_models.hf_tiny import TINY_CONFIGS
from maskcheck.reference_models.mutants import MUTANTS

ROOT = Path(__file__).resolve().parent.parent
PLAIN_MODULES = {  # mutation_score.py's plain modules: factory name -> (module, attribute)
    "plain_decoder": ("maskcheck.reference_models.plain", "plain_decoder"),
    "scratch_decoder": ("maskcheck.reference_models.scratch", "ScratchDecoder"),
    "scratch_decoder_taking_mask": ("maskcheck.reference_models.scratch", "ScratchDecoderTakingMask"),
    "tiny_torchtune": ("maskcheck.reference_models.torchtune_decoders", "tiny_torchtune"),
}


@dataclass
class Model:
    factory: str  # its function in the generated module
    label: str  # what the table calls it
    mutant: str | None = None  # the seeded bug, or None for a clean model
    clean_twin: str | None = None  # a seeded bug's clean twin's factory


@dataclass
class Tally:
    caught: list[str] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)
    false_positives: list[str] = field(default_factory=list)
    seconds: float = 0.0


def catalogue(only: set[str]) -> tuple[list[Model], str]:
    """The models, and the source of the module that builds each (one factory apiece)."""
    lines = [
        "import torch",
        "from maskcheck.reference_models import PRESETS, Transformer",
        "from maskcheck.reference_models.hf_tiny import tiny_model",
        "from maskcheck.reference_models.mutants import build, build_clean",
        "",
    ]
    models = []
    for name in MUTANTS:
        if only and name not in only:
            continue
        lines += [f"def bug_{name}():", f"    return build({name!r})"]
        lines += [f"def twin_{name}():", f"    return build_clean({name!r})"]
        models.append(Model(f"bug_{name}", name, mutant=name, clean_twin=f"twin_{name}"))
    clean: list[tuple[str, str, list[str]]] = []
    for preset in PRESETS:
        body = ["    torch.manual_seed(0)", f"    return Transformer(PRESETS[{preset!r}]).eval()"]
        clean.append((f"ref_{preset.replace('-', '_')}", f"ref:{preset}", body))
    for kind in TINY_CONFIGS:
        for implementation in ("eager", "sdpa"):
            body = [f"    return tiny_model({kind!r}, {implementation!r})"]
            clean.append((f"hf_{kind}_{implementation}", f"hf:{kind}/{implementation}", body))
    for factory, (module, attribute) in PLAIN_MODULES.items():
        body = [f"    from {module} import {attribute}", f"    return {attribute}()"]
        clean.append((factory, f"module:{module}:{attribute}", body))
    for factory, label, body in clean:
        if only and label not in only:
            continue
        lines += [f"def {factory}():", *body]
        models.append(Model(factory, label))
    return models, "\n".join(lines) + "\n"


def run(command: list[str], env: dict[str, str], cwd: Path) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    return time.perf_counter() - started, done


def maskcheck_run(model: Model, folder: Path, profile: str, env: dict[str, str]) -> tuple[float, dict[str, str], str]:
    """Seconds, and each check's status by ``suite/check`` (empty: the audit did not run, with why)."""
    report = folder / f"{model.factory}.json"
    command = [sys.executable, "-m", "maskcheck", "audit", f"module:peer_models:{model.factory}"]
    command += ["--profile", profile, "-q", "--json", str(report)]
    seconds, done = run(command, env, folder)
    if not report.exists():
        said = (done.stdout + done.stderr).strip().splitlines()
        return seconds, {}, said[-1] if said else f"exit {done.returncode}"
    data = json.loads(report.read_text())
    statuses = {f"{s['name']}/{c['name']}": c["status"] for s in data["suites"] for c in s.get("checks", [])}
    return seconds, statuses, ""


def peer_run(python: str, factory: str, folder: Path, env: dict[str, str]) -> tuple[float, set[str], str]:
    """Seconds, the peer's tests that failed or errored, and its summary line."""
    command = [python, "-m", "pytest", "-p", "no:cacheprovider", "-q", f"--torch-model=peer_models:{factory}"]
    seconds, done = run(command, env, folder)
    failed = {
        line.split()[1].split("[")[0].split("::")[-1]
        for line in done.stdout.splitlines()
        if line.startswith(("FAILED ", "ERROR "))
    }
    summary = next((line.strip("= ") for line in reversed(done.stdout.splitlines()) if " in " in line), "")
    if done.returncode not in (0, 1) and not failed:  # the run itself failed: everything it would test
        failed = {f"(exit {done.returncode})"}
    return seconds, failed, summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", required=True, help="the peer venv's python (benchmarks/setup_peer.sh)")
    parser.add_argument("--profile", default="quick", choices=PROFILE_NAMES)
    parser.add_argument("--only", default="", help="comma-separated seeded bugs or clean-model labels")
    args = parser.parse_args()
    peer = os.path.abspath(args.peer)  # run from the models folder; not resolved: the venv is the link
    models, source = catalogue({n for n in args.only.split(",") if n})
    ours, peers = Tally(), Tally()
    with tempfile.TemporaryDirectory() as tmp:
        folder, shim = Path(tmp) / "models", Path(tmp) / "shim"
        folder.mkdir()
        (folder / "peer_models.py").write_text(source)
        (shim / "maskcheck").mkdir(parents=True)
        (shim / "maskcheck" / "__init__.py").write_text("")
        for package in ("harness", "suites", "reference_models"):
            (shim / "maskcheck" / package).symlink_to(ROOT / package)
        base = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
        our_env = {**base, "PYTHONPATH": str(folder)}
        peer_env = {**base, "PYTHONPATH": f"{folder}{os.pathsep}{shim}"}
        print(f"{len(models)} models; maskcheck --profile {args.profile} against pytest-torch's zero-code run")
        for model in models:
            seconds, statuses, why = maskcheck_run(model, folder, args.profile, our_env)
            ours.seconds += seconds
            peer_seconds, failed, summary = peer_run(peer, model.factory, folder, peer_env)
            peers.seconds += peer_seconds
            if model.mutant is not None:
                mutant = MUTANTS[model.mutant]
                hit = statuses.get(f"{mutant.suite}/{mutant.check}") == "fail"
                (ours.caught if hit else ours.missed).append(model.label)
                # what the twin costs is the attribution's, not the peer's run: not counted
                _, twin_failed, _ = peer_run(peer, model.clean_twin, folder, peer_env)
                peer_hit = bool(failed - twin_failed)
                (peers.caught if peer_hit else peers.missed).append(model.label)
                print(
                    f"  {model.label:<40} maskcheck {'caught' if hit else 'missed':<6}  "
                    f"peer {'caught' if peer_hit else 'missed':<6} (fails {sorted(failed)}, twin {sorted(twin_failed)})"
                    + (f"  [maskcheck did not run: {why}]" if why else ""),
                    flush=True,
                )
            else:
                bad = sorted(k for k, v in statuses.items() if v in ("fail", "error", "not_run")) or (
                    [f"did not run: {why}"] if why else []
                )
                if bad:
                    ours.false_positives.append(model.label)
                if failed:
                    peers.false_positives.append(model.label)
                print(
                    f"  {model.label:<40} maskcheck {'FALSE POSITIVE ' + str(bad) if bad else 'clean'}  "
                    f"peer {'FALSE POSITIVE ' + str(sorted(failed)) if failed else 'clean'} ({summary})",
                    flush=True,
                )
    bugs = sum(m.mutant is not None for m in models)
    cleans = len(models) - bugs
    print(f"\n| tool | seeded bugs caught (of {bugs}) | false positives (of {cleans} clean models) | seconds |")
    print("|---|---:|---:|---:|")
    for tool, tally in ((f"maskcheck `--profile {args.profile}`", ours), ("pytest-torch zero-code run", peers)):
        print(f"| {tool} | {len(tally.caught)} | {len(tally.false_positives)} | {tally.seconds:.0f} |")
    print(f"\nmaskcheck missed: {', '.join(ours.missed) or 'none'}")
    print(f"peer caught: {', '.join(peers.caught) or 'none'}")
    print(f"peer's false positives: {', '.join(peers.false_positives) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
