"""The ``maskcheck`` command line: audit a model, list what is available.

Exit codes (docs/design.md): 0 clean; 1 a check failed, errored or did not run; 2 usage or
loading error, or nothing applicable; 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, NoReturn, Sequence

from ..adapters.task_names import TASKS
from ..engine.profile_names import PROFILE_NAMES
from ..engine.registry import maskcheck_version
from .quiet import quiet_transformers

DEFAULT_BUNDLE_DIR = "maskcheck-report"


class OneLineErrors(argparse.ArgumentParser):
    """A usage error is one line (what is wrong, and where the help is), not the usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrors(
        prog="maskcheck",
        description="Verify the masking and caching correctness of a Transformer.",
        epilog="Specs: ref:PRESET, ref:PATH.safetensors, ref:kv-retrieval, mutant:NAME, hf:DIR, module:pkg.mod:factory. "
        "Run 'maskcheck list' for presets, seeded bugs and suites.",
    )
    parser.add_argument("--version", action="version", version=f"maskcheck {maskcheck_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    audit = sub.add_parser(
        "audit",
        help="run the invariance suites against a model",
        description="Run the invariance suites against one model and print a verdict table. Options not given here "
        "are read from [tool.maskcheck] in the nearest pyproject.toml.",
        epilog="Exit codes: 0 clean (warnings allowed); 1 a check failed, errored or did not run; 2 usage or loading "
        "error, or no suite applied; 130 interrupted (the report keeps what finished).",
    )
    audit.add_argument(
        "spec",
        help="the model: ref:PRESET, ref:PATH, mutant:NAME, hf:DIR or module:pkg.mod:factory; or a data collator: collator:pkg.mod:factory",
    )
    audit.add_argument(
        "--suites", help="comma-separated suites to run (default: every suite; inapplicable ones report n/a)"
    )
    audit.add_argument("--device", help="cpu, cuda, cuda:N or auto (default: cpu)")
    audit.add_argument(
        "--dtype", choices=["float32", "bfloat16", "float16"], help="compute dtype (default: the model's own)"
    )
    audit.add_argument(
        "--attn-implementation",
        help="Hugging Face attention backend(s), comma-separated, e.g. eager,sdpa: one audit each",
    )
    audit.add_argument(
        "--task",
        choices=[*TASKS, "packed"],
        help="hf: the head to load, where config.json's architectures cannot say (sequence-classification and token-classification heads, reward models with one label, feature-extraction for a base model); collator: what the collator builds (causal-lm, packed, seq2seq; default causal-lm)",
    )
    audit.add_argument("--examples", type=int, help="cases per check (default: from the profile)")
    audit.add_argument(
        "--seed", type=int, help="seed for case generation (default: 0); the same seed draws the same cases"
    )
    audit.add_argument(
        "--profile",
        choices=PROFILE_NAMES,
        help="quick: each check's minimal case alone, dev: 8 cases per check, ci: 10, thorough: 200 (default: dev)",
    )
    audit.add_argument(
        "--paths",
        metavar="PATHS",
        help="call paths every check runs on besides its own canonical one, comma-separated: bare_call, "
        "mask_of_ones, default_cache, training (default: every path the model can take; 'canonical' alone: none)",
    )
    audit.add_argument(
        "--timeout", type=float, metavar="SECONDS", help="time limit per suite; checks cut short report NOT RUN"
    )
    audit.add_argument(
        "--one-case-per-forward",
        action="store_true",
        help="never stack the forwards of several cases (by default they share forwards once padding/batch_composition passes)",
    )
    audit.add_argument(
        "--probes",
        help="comma-separated long-context probes to run after the suites, with their defaults (needle, lost-in-the-middle)",
    )
    audit.add_argument("--json", dest="json_path", help="write the JSON report here (updated after every suite)")
    audit.add_argument(
        "--report",
        dest="report_dir",
        help="write report.json, report.md, the effective-mask picture of every failing mask suite and the "
        "reproduction bundles into this directory (without it, bundles of failing suites go to ./maskcheck-report)",
    )
    audit.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="ref: override a config field, forcing another layout (repeatable)",
    )
    audit.add_argument(
        "--device-map",
        help="hf: shard a checkpoint larger than one device with accelerate, e.g. auto (needs the 'sharding' extra)",
    )
    audit.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="hf: allow code shipped with the checkpoint to run (off by default)",
    )
    audit.add_argument(
        "--allow-pickle",
        action="store_true",
        help="load .bin/.pt weights when there are no safetensors, with torch.load(weights_only=True) (off by default: unpickling can run code)",
    )
    audit.add_argument("-q", "--quiet", action="store_true", help="print only the verdict table")
    audit.add_argument("-v", "--verbose", action="store_true", help="print every check, and tracebacks on errors")

    sub.add_parser(
        "list",
        help="list suites, probes, reference presets, shipped checkpoints and seeded bugs",
        description="List suites, probes, reference presets, shipped checkpoints and seeded bugs.",
    )

    probe = sub.add_parser(
        "probe",
        help="long-context probes: needle retrieval, lost in the middle",
        description="Measure what a model retrieves from long context. Probes measure; with --min-accuracy they also "
        "exit 1 when accuracy falls below it. Reference models: ref:kv-retrieval (shipped) or a checkpoint trained on "
        "the synthetic retrieval task; Hugging Face directories need their tokenizer files.",
    )
    probe.add_argument("name", choices=["needle", "lost-in-the-middle"], help="which probe")
    probe.add_argument("spec", help="the model spec")
    probe.add_argument(
        "--lengths",
        help="needle: comma-separated context lengths in tokens (default: doubling from 32 to the model's maximum)",
    )
    probe.add_argument(
        "--depths",
        default="11",
        help="needle: comma-separated depths in [0, 1], or a count of evenly spaced ones (default: 11)",
    )
    probe.add_argument(
        "--length",
        type=int,
        help="lost-in-the-middle: context length (default: the trained length, else min(max, 512))",
    )
    probe.add_argument(
        "--items", type=int, default=6, help="lost-in-the-middle: number of key-value items (default: 6)"
    )
    probe.add_argument("--samples", type=int, help="prompts per cell (default: needle 4, lost-in-the-middle 8)")
    probe.add_argument("--seed", type=int, default=0)
    probe.add_argument(
        "--threshold",
        type=float,
        default=0.9,
        help="accuracy that counts for effective length and reach (default: 0.9)",
    )
    probe.add_argument("--min-accuracy", type=float, help="exit 1 if the overall accuracy is below this")
    probe.add_argument(
        "--text", help="a text file to build haystacks from (models with a tokenizer; default: seeded pseudo-prose)"
    )
    probe.add_argument(
        "--needle-template", help="models with a tokenizer: the needle (and item) text, with {key} and {value}"
    )
    probe.add_argument("--question-template", help="the question and answer prefix, with {key}")
    probe.add_argument(
        "--answer-template", help="the answer as it follows the prefix, with {value} (default: ' {value}')"
    )
    probe.add_argument(
        "--generate",
        action="store_true",
        help="also decode every answer greedily and match the value as a string, for parity with published needle benchmarks",
    )
    probe.add_argument(
        "--report",
        dest="report_dir",
        default="maskcheck-report",
        help="where the JSON grid and the PNG go (default: maskcheck-report)",
    )
    probe.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="ref: run the weights under another mask, e.g. sliding_window=8, attention_sinks=4",
    )
    probe.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    probe.add_argument("--dtype", choices=["float32", "bfloat16", "float16"])

    cost = sub.add_parser(
        "profile",
        help="cost profile: latency, KV-cache bytes and peak memory over context length",
        description="Measure prefill and per-token decode latency (P50/P95) at doubling context lengths, generation "
        "with vs without the KV cache, KV-cache bytes per token (measured vs formula) and peak memory; print a table "
        "and write JSON and a PNG plot.",
    )
    cost.add_argument("spec", help="the model spec (a decoder with a cache)")
    cost.add_argument(
        "--lengths",
        help="comma-separated context lengths (default: doubling from 128, then the model's maximum less the decoded tokens)",
    )
    cost.add_argument(
        "--max-seconds",
        type=float,
        default=120.0,
        help="time budget; stops at the longest length that fits (default: 120)",
    )
    cost.add_argument("--repeats", type=int, default=5, help="prefill repeats per length (default: 5)")
    cost.add_argument("--new-tokens", type=int, default=16, help="decoded tokens per length (default: 16)")
    cost.add_argument(
        "--report", dest="report_dir", default="maskcheck-report", help="where profile.json and profile.png go"
    )
    cost.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    cost.add_argument("--dtype", choices=["float32", "bfloat16", "float16"])
    cost.add_argument("--device-map", help="hf: accelerate device map, e.g. auto (needs the 'sharding' extra)")

    replay = sub.add_parser(
        "replay",
        help="replay a reproduction bundle",
        description="Replay the shrunk cases of a reproduction bundle (maskcheck-report/repro-SUITE) and print the verdicts. "
        "Exit 1 if a case still fails.",
    )
    replay.add_argument("bundle", help="the bundle directory (or its case.json)")
    replay.add_argument("--model", help="replay on another model (a spec) instead of the one recorded in the bundle")
    replay.add_argument("--device", help="cpu, cuda or auto (default: the device recorded in the bundle)")

    from .canary import add_parser as add_canary

    add_canary(sub)

    from .compare import add_parser as add_compare

    add_compare(sub)

    picture = sub.add_parser(
        "effective-mask",
        help="draw which input positions influence which outputs",
        description="Measure the effective mask of a model (perturb each input position, record the change at every "
        "output) and draw it beside the mask the suite expects, leaks marked.",
    )
    picture.add_argument("spec", help="the model spec")
    picture.add_argument(
        "--suite",
        default="causal",
        help="a suite that draws an effective mask ('maskcheck list' marks them); causal: an unpadded row; "
        "padding: a row with 2 padded slots; cross_attention: decoder outputs vs a source with 2 padded slots",
    )
    picture.add_argument("--length", type=int, default=10, help="positions in the row (default: 10)")
    picture.add_argument("--out", default="effective-mask.png", help="PNG path (default: effective-mask.png)")
    picture.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "list":
            return cmd_list()
        if args.command == "effective-mask":
            return cmd_effective_mask(args)
        if args.command == "replay":
            return cmd_replay(args)
        if args.command == "probe":
            return cmd_probe(args)
        if args.command == "profile":
            return cmd_profile(args)
        if args.command == "compare":
            from .compare import cmd_compare

            return cmd_compare(args)
        if args.command == "canary":
            from .canary import cmd_canary

            return cmd_canary(args)
        return cmd_audit(args)
    except KeyboardInterrupt:
        print("maskcheck: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `maskcheck list | head`: the reader has gone, nothing is wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def cmd_list() -> int:
    from ...reference_models import PRESETS, SHIPPED
    from ...reference_models.mutants import MUTANTS
    from ..engine.registry import load_suite, probe_names, suite_names

    print("Suites (* draws an effective mask: maskcheck effective-mask --suite NAME):")
    for name in suite_names():
        suite = load_suite(name)
        print(f"  {name:<18}{'*' if suite.draws_effective_mask else ' '} {suite.summary}")
    print("\nReference presets (ref:NAME):")
    for name, config in PRESETS.items():
        print(f"  {name:<32} {config.family}, {config.norm_layout}-norm {config.norm}, {config.position} positions")
    print("\nShipped checkpoints (ref:NAME):")
    for name, path in SHIPPED.items():
        print(f"  {name:<32} {path.name}")
    print("\nProbes (maskcheck probe NAME SPEC):")
    for name in probe_names():
        print(f"  {name}")
    from ...reference_models.pipelines import PIPELINES

    print("\nTraining pipelines (maskcheck canary pipeline:NAME), clean and seeded:")
    for name, (factory, leaks) in PIPELINES.items():
        summary = " ".join((factory.__doc__ or "").split())
        print(f"  {name:<34} {'leaks' if leaks else 'clean'}: {summary}")
    print("\nSeeded bugs (mutant:NAME), with the suite and check that must catch them:")
    for name, mutant in MUTANTS.items():
        print(f"  {name:<34} {mutant.suite}/{mutant.check}: {mutant.description.splitlines()[0]}")
    return 0


def _overrides(pairs: list[str]) -> dict[str, str]:
    result = {}
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"--override expects KEY=VALUE, got {pair!r}")
        key, value = pair.split("=", 1)
        result[key.strip()] = value.strip()
    return result


def cmd_audit(args: argparse.Namespace) -> int:
    from ..adapters.specs import LoadOptions, SpecError
    from ..audits.config import ConfigError, load_config
    from ..audits.runner import audit
    from ..engine.registry import UnknownSuiteError, registered_suite_names, unknown_suites_message
    from ..report.render import keep_out_of_git, render_markdown, render_table, write_atomically, write_json

    if not args.verbose:
        quiet_transformers()
    try:
        config = load_config()
    except ConfigError as exc:
        print(f"maskcheck: error: {exc}", file=sys.stderr)
        return 2

    def option(name: str, key: str, default: Any) -> Any:
        value = getattr(args, name)
        return value if value is not None else config.get(key, default)

    if args.spec.startswith("collator:"):
        return _audit_collator(args, option)
    suites = _split(args.suites) if args.suites else config.get("suites")
    unknown = unknown_suites_message(suites or [], registered_suite_names())
    if unknown:  # before the model loads, which can take minutes
        print(f"maskcheck: error: {unknown}", file=sys.stderr)
        return 2
    live = sys.stderr.isatty()
    implementations = (
        _split(args.attn_implementation) if args.attn_implementation else config.get("attn_implementation")
    ) or [None]
    report_root = option("report_dir", "report", None)
    worst_exit = 0
    reports: list[dict[str, Any]] = []
    partial: list[Path] = []  # reports on disk, named if the audit is interrupted
    try:
        for implementation in implementations:
            report_dir = str(Path(report_root) / implementation) if report_root and implementation else report_root
            # Bundles are written on failure even without --report: a leak is only useful with its reproduction.
            bundle_dir = report_dir or str(Path(DEFAULT_BUNDLE_DIR) / (implementation or ""))
            json_path = Path(args.json_path) if args.json_path and len(implementations) == 1 else None
            started = time.perf_counter()

            paths = ([json_path] if json_path else []) + ([Path(report_dir) / "report.json"] if report_dir else [])
            partial += paths

            def save_progress(event: str, suite: str, result: Any, paths: list[Path] = paths) -> None:
                if event == "case":
                    # A live line on a terminal only; logs get one line per suite.
                    if live and not args.quiet:
                        print(f"\r  running {suite:<60}", end="", file=sys.stderr, flush=True)
                    return
                if live and not args.quiet:
                    print("\r" + " " * 72 + "\r", end="", file=sys.stderr, flush=True)  # clear the live line
                if event == "start" and not args.quiet:
                    print(f"  running {suite} ...", file=sys.stderr, flush=True)
                # After every suite (and before the first) the reports on disk hold what finished.
                for path in paths:
                    write_json(path, result.to_dict())

            try:
                options = LoadOptions(
                    device=option("device", "device", "cpu"),
                    dtype=option("dtype", "dtype", None),
                    task=option("task", "task", None),
                    attn_implementation=implementation,
                    overrides=_overrides(args.override),
                    trust_remote_code=args.trust_remote_code,
                    allow_pickle=args.allow_pickle,
                    device_map=args.device_map,
                )
                result = audit(
                    args.spec,
                    suites,
                    options=options,
                    seed=option("seed", "seed", 0),
                    profile=option("profile", "profile", "dev"),
                    examples=option("examples", "examples", None),
                    timeout=option("timeout", "timeout", None),
                    known_findings=config.get("known_findings", ()),
                    disabled_conventions=config.get("disabled_conventions", ()),
                    probes=_split(args.probes) if args.probes else (),
                    progress=save_progress,
                    report_dir=report_dir,
                    bundle_dir=bundle_dir,
                    tolerance_overrides=config.get("tolerance"),
                    batch_cases=not args.one_case_per_forward,
                    paths=_split(args.paths) if args.paths else config.get("paths"),
                )
            except (SpecError, UnknownSuiteError, ValueError) as exc:
                message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
                print(f"maskcheck: error: {message}", file=sys.stderr)
                if args.verbose:
                    raise
                return 2
            title = result.model + (f" [attn_implementation={implementation}]" if implementation else "")
            print(render_table(result, title, time.perf_counter() - started, verbose=args.verbose))
            reports.append(result.to_dict())
            if report_dir:
                write_json(
                    Path(report_dir) / "report.json", result.to_dict()
                )  # with the probes, which run after the last suite
                write_atomically(Path(report_dir) / "report.md", render_markdown(result.to_dict()))
                keep_out_of_git(report_root or report_dir)
                print(f"report: {report_dir}/report.json, {report_dir}/report.md")
            worst_exit = max(worst_exit, result.exit_code)
    except KeyboardInterrupt:
        if partial:
            where = ", ".join(dict.fromkeys(str(p) for p in partial))
            print(
                f'maskcheck: interrupted; the suites that finished are in {where} ("complete": false)', file=sys.stderr
            )
        else:
            print(
                "maskcheck: interrupted; nothing was saved (--report DIR or --json PATH keep what finishes)",
                file=sys.stderr,
            )
        return 130
    if args.json_path:
        write_json(Path(args.json_path), reports[0] if len(reports) == 1 else {"audits": reports})
        print(f"JSON report: {args.json_path}")
    keep_out_of_git(DEFAULT_BUNDLE_DIR)  # where bundles go without --report (no-op if none was written)
    return worst_exit


def _audit_collator(args: argparse.Namespace, option: Any) -> int:
    """``maskcheck audit collator:pkg.mod:factory --task ...``: the collator checks, one table."""
    from ..audits.collator_audit import CollatorError, audit_collator
    from ..report.render import keep_out_of_git, render_markdown, render_table, write_atomically, write_json

    started = time.perf_counter()
    report_dir = option("report_dir", "report", None)
    try:
        result = audit_collator(
            args.spec,
            args.task or "causal-lm",
            seed=option("seed", "seed", 0),
            profile=option("profile", "profile", "dev"),
            examples=option("examples", "examples", None),
            bundle_dir=report_dir or DEFAULT_BUNDLE_DIR,
        )
    except CollatorError as exc:
        print(f"maskcheck: error: {exc}", file=sys.stderr)
        return 2
    print(
        render_table(
            result,
            f"{result.model} [task={args.task or 'causal-lm'}]",
            time.perf_counter() - started,
            verbose=args.verbose,
        )
    )
    if args.json_path:
        write_json(Path(args.json_path), result.to_dict())
        print(f"JSON report: {args.json_path}")
    if report_dir:
        write_json(Path(report_dir) / "report.json", result.to_dict())
        write_atomically(Path(report_dir) / "report.md", render_markdown(result.to_dict()))
        keep_out_of_git(report_dir)
        print(f"report: {report_dir}/report.json, {report_dir}/report.md")
    return result.exit_code


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def cmd_effective_mask(args: argparse.Namespace) -> int:
    from ..adapters.specs import LoadOptions, SpecError, load_adapter
    from ..engine.registry import load_suite, suite_names
    from ..engine.suite import RunContext
    from ..engine.tolerance import tolerance_for
    from ..report.picture import draw_effective_mask

    drawing = suite_names(lambda suite: suite.draws_effective_mask)
    if args.suite not in drawing:
        print(
            f"maskcheck: error: --suite {args.suite!r} draws no effective mask; choose one of {', '.join(drawing)}",
            file=sys.stderr,
        )
        return 2
    quiet_transformers()
    try:
        adapter = load_adapter(args.spec, LoadOptions(device=args.device))
    except SpecError as exc:
        print(f"maskcheck: error: {exc}", file=sys.stderr)
        return 2
    caps = adapter.capabilities
    context = RunContext(
        tolerance=tolerance_for(caps.device, caps.dtype), dtype=caps.dtype, units=caps.output_kind.units
    )
    influence, expected = load_suite(args.suite).effective_mask(adapter, context, length=args.length)
    leaks = int((influence.measured & ~expected).sum())
    path = draw_effective_mask(influence, expected, args.out, f"{adapter.spec}: {args.suite}")
    print(f"{path}: {leaks} leaking cell(s) of {expected.numel()}")
    return 1 if leaks else 0


def cmd_probe(args: argparse.Namespace) -> int:
    from ..adapters.specs import LoadOptions, SpecError, load_adapter
    from ..engine.registry import load_probe
    from ..engine.suite import ProbeError

    quiet_transformers()
    try:
        adapter = load_adapter(
            args.spec, LoadOptions(device=args.device, dtype=args.dtype, overrides=_overrides(args.override))
        )
        text = Path(args.text).read_text() if args.text else None
        run, draw = load_probe(args.name)
        kwargs: dict[str, Any] = {
            "seed": args.seed,
            "text": text,
            "progress": _probe_progress(args.name),
            "generate": args.generate,
            "templates": _templates(args),
        }
        if args.samples:
            kwargs["samples"] = args.samples
        if args.name == "needle":
            kwargs.update(threshold=args.threshold, depths=_depths(args.depths))
            if args.lengths:
                kwargs["lengths"] = [int(x) for x in _split(args.lengths)]
        else:
            kwargs.update(length=args.length, items=args.items)
        result = run(adapter, **kwargs)
        if args.override:
            result.model += f" with {', '.join(args.override)}"  # a control: the same weights under another mask
    except (SpecError, ProbeError, OSError, ValueError) as exc:
        print(f"maskcheck: error: {exc}", file=sys.stderr)
        return 2
    result.write(args.report_dir, draw)
    print(render_probe(result))
    print(f"grid: {result.grid_path}\npicture: {result.picture}")
    if (
        args.min_accuracy is not None
        and result.summary.get("accuracy", min(result.summary.get("accuracy_by_slot", [1.0]))) < args.min_accuracy
    ):
        return 1
    return 0


def _templates(args: argparse.Namespace) -> dict[str, str] | None:
    """The template strings given on the command line (the probe builds its templates from them)."""
    chosen = {
        "needle": args.needle_template,
        "item": args.needle_template,
        "question": args.question_template,
        "answer": args.answer_template,
    }
    return {k: v for k, v in chosen.items() if v} or None


def _depths(text: str) -> list[float]:
    if "," not in text and "." not in text:
        count = int(text)
        return [i / (count - 1) for i in range(count)] if count > 1 else [0.5]
    depths = [float(x) for x in _split(text)]
    if not all(0.0 <= d <= 1.0 for d in depths):
        raise ValueError("--depths must lie in [0, 1]")
    return depths


def _probe_progress(name: str) -> Any:
    def report(done: int, total: int) -> None:
        if done == total or done % max(1, total // 10) == 0:
            print(f"  {name}: {done}/{total} prompts", file=sys.stderr, flush=True)

    return report


def render_probe(result: Any) -> str:
    s = result.summary
    lines = [f"maskcheck probe {result.name} on {result.model}"]
    if result.name == "needle":
        lines.append("length  accuracy  min over depths  note")
        for length in s["lengths"]:
            note = s["flags"].get(str(length), "")
            lines.append(
                f"{length:<7} {s['accuracy_by_length'][str(length)]:<9.3f} {s['min_accuracy_over_depths'][str(length)]:<16.3f} {note}".rstrip()
            )
        lines.append(
            f"effective length {s['effective_length']}, reach {s['reach']} tokens (threshold {s['threshold']}); "
            f"mean rank {s['mean_rank']:.2f}, margin {s['mean_margin']:.2f}, retrieval gain {s['mean_gain']:.2f} nats"
        )
    else:
        lines.append("slot  " + "  ".join(f"{i + 1:>5}" for i in range(s["items"])))
        lines.append("acc   " + "  ".join(f"{a:>5.2f}" for a in s["accuracy_by_slot"]))
        lines.append(
            f"edge vs middle {s['edge_vs_middle']:.2f}; closed book {s['closed_book_accuracy']:.2f}; "
            f"retrieval gain {s['mean_gain']:.2f} nats; {s['length']} tokens{'; ' + next(iter(s['flags'].values())) if s['flags'] else ''}"
        )
    if "generated_accuracy" in s:
        lines.append(f"greedy generation matches the value in {s['generated_accuracy']:.1%} of prompts")
    return "\n".join(lines)


def cmd_profile(args: argparse.Namespace) -> int:
    from ..adapters.base import AdapterError
    from ..adapters.specs import LoadOptions, SpecError, load_adapter
    from ..audits.costs import draw, profile, render
    from ..report.render import write_json

    quiet_transformers()
    try:
        adapter = load_adapter(args.spec, LoadOptions(device=args.device, dtype=args.dtype, device_map=args.device_map))
        lengths = [int(x) for x in _split(args.lengths)] if args.lengths else None

        def progress(costs: Any) -> None:
            print(f"  profiled {costs.length} tokens in {costs.seconds:.1f}s", file=sys.stderr, flush=True)

        result = profile(adapter, lengths, args.max_seconds, args.repeats, args.new_tokens, progress=progress)
    except (SpecError, ValueError, AdapterError) as exc:
        print(f"maskcheck: error: {exc}", file=sys.stderr)
        return 2
    print(render(result))
    directory = Path(args.report_dir)
    write_json(directory / "profile.json", result.to_dict())
    print(f"JSON: {directory / 'profile.json'}\nplot: {draw(result, directory / 'profile.png')}")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from ..adapters.specs import SpecError
    from ..report.reproduction import BundleError, replay

    quiet_transformers()
    if _is_collator_bundle(args.bundle):
        return _replay_collator(args.bundle)
    try:
        results = replay(args.bundle, model=args.model, device=args.device)
    except (BundleError, SpecError) as exc:
        print(f"maskcheck: error: {exc}", file=sys.stderr)
        return 2
    for result in results:
        print(result.report())
    return 1 if any(r.status == "fail" for r in results) else 0


def _is_collator_bundle(path: str) -> bool:
    case = Path(path) / "case.json" if Path(path).is_dir() else Path(path)
    try:
        return json.loads(case.read_text()).get("kind") == "collator"
    except (OSError, ValueError, AttributeError):
        return False  # the model bundle reader says what is wrong with it


def _replay_collator(path: str) -> int:
    from ..audits.collator_audit import CollatorError, replay_collator_case

    case = Path(path) / "case.json" if Path(path).is_dir() else Path(path)
    data = json.loads(case.read_text())
    failed = False
    for index, recorded in enumerate(data["cases"]):
        try:
            outcome, batch = replay_collator_case(data, index)
        except CollatorError as exc:
            print(f"maskcheck: error: {exc}", file=sys.stderr)
            return 2
        failed |= outcome.status == "fail"
        shown = {k: v.tolist() if hasattr(v, "tolist") else v for k, v in (batch or {}).items()}
        print(
            f"collator/{recorded['check']}: {outcome.status.upper()}{': ' + outcome.message if outcome.message else ''}\n  examples: {recorded['examples']}\n  batch: {shown}"
        )
    return 1 if failed else 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
