"""The `drumsd` command line: serve and check-config (more subcommands register themselves)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def build_parser() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    parser = argparse.ArgumentParser(prog="drumsd", description="the drums host daemon")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the daemon")
    serve.add_argument("--config", type=Path, required=True, help="the JSON config file")
    serve.add_argument(
        "--trusted-unhardened",
        action="store_true",
        help="run slots without the hardening profile: only for trusted agent code",
    )
    serve.set_defaults(func=_cmd_serve)

    check = sub.add_parser("check-config", help="validate a config and print the effective one")
    check.add_argument("path", type=Path, nargs="?", help="the JSON config file")
    check.add_argument("--defaults", action="store_true", help="print every default and exit")
    check.add_argument(
        "--explain",
        action="store_true",
        help="print how the documented config table's keys are read here, and exit",
    )
    check.set_defaults(func=_cmd_check_config)

    # Host subcommands (doctor, image, host, bench) register themselves when installed.
    bench = sub.add_parser(
        "bench", help="measure cold boot, create, reset, fork, step and memory (table + JSON)"
    )
    from drumsd.bench.runtime import add_bench_args, main_bench

    add_bench_args(bench)
    bench.set_defaults(func=main_bench)
    bench_sub = bench.add_subparsers(dest="bench_mode", metavar="{episodes}")
    episodes = bench_sub.add_parser(
        "episodes",
        help="whole episodes on a task mix: drums beside its features off and a boot per "
        "episode (table + JSON)",
    )
    from drumsd.bench.episodes import add_episode_args, main_episode_bench

    add_episode_args(episodes)
    episodes.set_defaults(func=main_episode_bench)

    tasks = sub.add_parser("tasks", help="task sets: what this host can run")
    tasks_sub = tasks.add_subparsers(dest="tasks_command", required=True)
    cover = tasks_sub.add_parser(
        "coverage", help="supported / total per domain of a task set, with the reasons"
    )
    from drumsd.tasks.coverage import add_coverage_args, main_coverage

    add_coverage_args(cover)
    cover.set_defaults(func=main_coverage)
    fetch = tasks_sub.add_parser(
        "fetch-osworld", help="fetch the pinned OSWorld commit's task files (needs network)"
    )
    from drumsd.tasks.osworld_pin import add_fetch_args, main_fetch

    add_fetch_args(fetch)
    fetch.set_defaults(func=main_fetch)

    audit = sub.add_parser("audit", help="reward audits over task sets")
    audit_sub = audit.add_subparsers(dest="audit_command", required=True)
    exploits = audit_sub.add_parser(
        "exploits",
        help="play a dishonest agent against every task of a set: which rewards it takes "
        "without doing the task (table + JSON)",
    )
    from drumsd.exploits import add_exploit_args, main_exploits

    add_exploit_args(exploits)
    exploits.set_defaults(func=main_exploits)

    try:
        from drumsd import cli_host
    except ImportError:
        pass
    else:
        cli_host.register(sub)
    return parser, sub


def _cmd_serve(args: argparse.Namespace) -> int:
    from drumsd.serve import main_serve

    return main_serve(args.config, trusted_unhardened=args.trusted_unhardened)


def _cmd_check_config(args: argparse.Namespace) -> int:
    from drumsd.core.config import defaults_json, effective_config_json
    from drumsd.linux.config_file import load_config_or_report

    if args.defaults:
        print(defaults_json())
        return 0
    if args.explain:
        from drumsd.core.config_compat import rules

        print(f"{'documented key':<28} {'here':<9} what it is here")
        for rule in rules():
            print(f"{rule.key:<28} {rule.status:<9} {rule.here}")
        return 0
    if args.path is None:
        print("drumsd check-config: give a config PATH (or --defaults)", file=sys.stderr)
        return 2
    config = load_config_or_report(args.path)
    if config is None:
        return 1
    print(effective_config_json(config))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser, _ = build_parser()
    args = parser.parse_args(argv)
    # Subcommands registered by other modules (cli_host, bench) set `handler`; ours set `func`.
    run = getattr(args, "func", None) or args.handler
    return int(run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
