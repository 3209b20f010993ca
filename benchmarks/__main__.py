"""``python -m benchmarks run|report|adopt|page|list``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run scenarios and write a bench_v1 result file")
    which = run.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_true", help="every registered scenario (the default)")
    which.add_argument("--scenario", action="append", metavar="NAME", help="a scenario to run (repeatable)")
    run.add_argument("--repeats", type=int, default=5, help="samples per measurement (default 5)")
    run.add_argument("--smoke", action="store_true", help="one sample at tiny scale; labelled not representative")
    run.add_argument("--out", type=Path, default=None, help="result file (default benchmarks/results/<stamp>-<host>.json)")
    report = sub.add_parser("report", help="render a result file as Markdown")
    report.add_argument("result", type=Path)
    report.add_argument("--document", action="store_true", help="a whole docs page, with title and preamble")
    adopt = sub.add_parser("adopt", help="make result files the reference of their scenarios; regenerate the docs page")
    adopt.add_argument("results", type=Path, nargs="+")
    sub.add_parser("page", help="regenerate docs/benchmarks.md from the reference results")
    sub.add_parser("list", help="list the registered scenarios")
    args = parser.parse_args(argv)

    from benchmarks import report as report_module
    from benchmarks.registry import SCENARIOS

    if args.command in ("adopt", "page"):
        from benchmarks import reference

        if args.command == "adopt":
            try:
                adopted = reference.adopt(args.results)
            except (OSError, ValueError) as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 1
            print(f"reference results of: {', '.join(adopted)}")
        from flashruntime.files import write_atomic

        write_atomic(reference.DOCS_PAGE, reference.render_page(reference.load_references()))
        print(f"wrote {reference.DOCS_PAGE}")
        return 0
    if args.command == "list":
        for scenario in SCENARIOS.values():
            print(f"{scenario.name:20} {scenario.section:12} {scenario.hypothesis}")
        return 0
    if args.command == "report":
        result = json.loads(args.result.read_text())
        render = report_module.render_document if args.document else report_module.render_markdown
        try:
            print(render(result), end="")
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return 0

    from benchmarks.runner import default_out, run_scenarios

    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    names = args.scenario or list(SCENARIOS)
    out = args.out or default_out()
    try:
        result, clean = run_scenarios(names, args.repeats, args.smoke, out)
    except KeyError as exc:
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return 2
    try:
        print(report_module.render_markdown(result), end="")
    except ValueError as exc:  # thin rows are kept in the file, only the table is refused
        print(f"(table not rendered: {exc})")
    print(f"result file: {out}")
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
