"""Fold py-spy's raw (collapsed) stacks into shares per function: self (the sampled leaf) and inclusive
(anywhere on the stack, once per sample), as percentages of all samples.

Usage: python stack_shares.py STACKS.txt [--top 40] [--under FUNCTION]
--under keeps only the samples whose stack passes through FUNCTION (a substring of "name (file:line)").
Written for bench/perf/profile_pinned.sh; py-spy's `-f raw` lines are "frame;frame;...;leaf COUNT".
"""

from __future__ import annotations

import argparse
import re
from collections import Counter

_LINE = re.compile(r"^(.*) (\d+)$")


def frame_name(frame: str) -> str:
    """'handle (specwatch/exporter/tap.py:331)' -> 'handle (specwatch/exporter/tap.py)': lines merged."""
    return re.sub(r":\d+\)$", ")", frame.strip())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stacks")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--under", default=None)
    args = parser.parse_args()
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    with open(args.stacks, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            match = _LINE.match(line.rstrip("\n"))
            if match is None:
                continue
            frames = [frame_name(f) for f in match[1].split(";") if f]
            if args.under is not None and not any(args.under in f for f in frames):
                continue
            count = int(match[2])
            total += count
            if frames:
                own[frames[-1]] += count
            for name in set(frames):
                inclusive[name] += count
    if total == 0:
        print("no samples")
        return 1
    print(f"{total} samples{'' if args.under is None else ' under ' + args.under}")
    print(f"{'self %':>7} {'incl %':>7}  function")
    for name, count in inclusive.most_common(args.top):
        print(f"{100 * own[name] / total:7.1f} {100 * count / total:7.1f}  {name}")
    print("-- by self time")
    for name, count in own.most_common(args.top):
        print(f"{100 * count / total:7.1f} {100 * inclusive[name] / total:7.1f}  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
