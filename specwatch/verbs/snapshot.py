"""The `specwatch snapshot` verb: write an exact snapshot of a /metrics endpoint (vLLM's or the exporter's)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from specwatch.config import Home
from specwatch.exit_codes import EXIT_OK


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", help="the server or exporter base URL (or its /metrics URL)")
    parser.add_argument("--out", type=Path, required=True, help="file to write")


def run(home: Home, args: argparse.Namespace) -> int:
    from specwatch import snapshot

    snap = snapshot.take(args.url)
    snapshot.write(snap, args.out)
    print(f"{args.out}: {snap.url} at {time.strftime('%Y-%m-%dT%H:%M:%S', time.localtime(snap.taken_at))}")
    return EXIT_OK
