"""The ``raydelay`` command: run a local raydelay, manage topics, produce, consume,
cancel, look at stats, ingest from files through Spark, and run the demo.

Every command but ``up`` and ``demo`` attaches to a running Ray: ``--address`` (or
``RAYDELAY_ADDRESS``), else the local one that ``raydelay up`` started; ``--config`` (or
``RAYDELAY_CONFIG``) names the config. Global options go before or after the command. A
mistake prints one line (``raydelay: error: ...``), no traceback, and exits with a status
that says what kind it was (:class:`raydelay.cli.output.Exit`: 2 usage, 3 not found,
4 unavailable, 5 refused). ``--json`` makes the output JSON (:mod:`raydelay.cli.output`).

The commands live by concern: :mod:`raydelay.cli.local` (up, down, topics, console,
placement, demo, ingest), :mod:`raydelay.cli.messages` (produce, consume, peek, cancel,
redrive, reset-cursor), :mod:`raydelay.cli.reports` (stats, tasks, schedules);
:mod:`raydelay.cli.parser` wires them to their arguments and :mod:`raydelay.cli.attach`
joins the cluster.
"""

from __future__ import annotations

import logging
import os
import sys

import argcomplete

from raydelay.cli.attach import detach
from raydelay.cli.output import Exit, exit_for
from raydelay.cli.parser import CONFIG_ENV, build_parser
from raydelay.errors import InvalidArgument, RaydelayError

__all__ = ["Exit", "build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argcomplete.autocomplete(parser)  # answers a shell's completion request, and exits
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if getattr(args, "func", None) is None:
        parser.print_help()
        return Exit.USAGE
    try:
        _check_config_env(args)
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # here, where a closed pipe is caught below, not at exit
        return code
    except RaydelayError as exc:
        print(f"raydelay: error: {exc}", file=sys.stderr)
        return exit_for(exc)
    except KeyboardInterrupt:
        print("raydelay: interrupted", file=sys.stderr)
        return Exit.INTERRUPTED
    except BrokenPipeError:  # `raydelay stats ... | head`: the reader has had enough
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the exit's flush does not fail again
        return 0
    finally:
        detach(args)


def _check_config_env(args) -> None:
    """A config named by RAYDELAY_CONFIG that is not there: the error says where the name
    came from (the loader's own error names only the path)."""
    named = os.environ.get(CONFIG_ENV)
    config = getattr(args, "config", None)
    if named and config == named and not os.path.exists(named):
        raise InvalidArgument(f"config: {named!r} does not exist (named by ${CONFIG_ENV})")
