"""The ``raydelay`` command. More commands arrive with the Ray data path (see README)."""

from __future__ import annotations

import argparse
import logging
import sys

from raydelay import __version__
from raydelay.errors import RaydelayError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raydelay", description="raydelay: delayed and scheduled messages, durably."
    )
    parser.add_argument("--version", action="version", version=f"raydelay {__version__}")
    parser.add_argument("--config", help="a config TOML (default: the embedded default)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser(
        "demo",
        help="run the order-timeout demo on the embedded local-dir store",
        description="Order timeouts through the delayed index in real time, with cancels and a restart.",
    )
    demo.add_argument(
        "--messages", type=int, default=200_000, help="order timeouts to schedule (default 200000)"
    )
    demo.add_argument(
        "--seconds", type=float, default=20.0, help="spread of the timeouts in seconds (default 20)"
    )
    demo.add_argument(
        "--paid-share",
        type=float,
        default=0.2,
        help="share of orders paid, i.e. cancelled (default 0.2)",
    )
    demo.add_argument("--quick", action="store_true", help="20k messages over 5 s")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        from raydelay.config import load_config

        config = load_config(args.config)
        if args.command == "demo":
            from raydelay.demo import run_demo

            messages, seconds = (20_000, 5.0) if args.quick else (args.messages, args.seconds)
            report = run_demo(
                messages=messages, spread_s=seconds, paid_share=args.paid_share, config=config
            )
            return 0 if report.ok else 1
        parser.print_help()
        return 2
    except RaydelayError as exc:
        print(f"raydelay: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("raydelay: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
