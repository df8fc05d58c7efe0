"""The `ovex` command: trainer subcommands (train, evaluate, predict, synth) plus service ones.

Errors users can act on (`OvexError`: bad data, bad artifact, bad params) print `error: ...` on stderr
and exit with status 2 — never a traceback.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Sequence
from typing import Any

from trainer import cli as trainer_cli
from trainer.errors import OvexError


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ovex")
    except PackageNotFoundError:  # run from a checkout that is not installed
        return "(not installed)"


def _trainer_parser() -> tuple[argparse.ArgumentParser, Any]:
    """The `ovex` parser with the trainer's commands (train, evaluate, predict, synth), and its subparsers."""
    parser = argparse.ArgumentParser(prog="ovex", description="extreme classification with OVE-SGD")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    trainer_cli.add_commands(sub)
    return parser, sub


def _add_service_commands(sub: Any) -> None:
    from service import serve as serve_cli
    from service.training import worker as jobs_worker

    jobs_worker.add_command(sub)
    serve_cli.add_commands(sub)


def build_parser() -> argparse.ArgumentParser:
    parser, sub = _trainer_parser()
    _add_service_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # a trainer command never imports the server's modules (the web framework, the job database)
    parser, sub = _trainer_parser()
    if not (argv and argv[0] in sub.choices):
        _add_service_commands(sub)
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except OvexError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `ovex predict ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    return code


def entry() -> None:
    """The console script: `main`, then exit without the collector's last pass.

    Why: at exit the interpreter's final collection walks every object torch and numba created (half a
    second after a training run); frozen, they are left to the operating system, as the process ends.
    """
    code = main()
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    entry()
