"""Fold py-spy's raw (collapsed) stacks into shares per function: self (the sampled leaf) and inclusive
(anywhere on the stack, once per sample), as percentages of the busy samples (those not waiting in
`epoll_pwait`: the loop idle).

Usage: python stack_shares.py STACKS.txt [--top 40]
       python stack_shares.py STACKS.txt --against OTHER.txt --requests N [--min-share 1.0]
--against compares two profiles of the same load (N requests each): inclusive busy samples per 100
requests for every function above --min-share percent in either, and the difference. With py-spy's
--native (the process paused per sample) the sample count is proportional to CPU time.
Written for bench/perf/profile_pinned.sh; py-spy's `-f raw` lines are "frame;frame;...;leaf COUNT".
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from typing import NamedTuple

_LINE = re.compile(r"^(.*) (\d+)$")
_NOISE = re.compile(r"object\.h\)$|^0x[0-9a-f]+ ")  # refcount inlines and unnamed native frames


class Profile(NamedTuple):
    own: Counter[str]
    inclusive: Counter[str]
    busy: int


def frame_name(frame: str) -> str:
    """'handle (specwatch/exporter/tap.py:331)' -> 'handle (specwatch/exporter/tap.py)': lines merged."""
    return re.sub(r":\d+\)$", ")", frame.strip())


def load(path: str) -> Profile:
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    busy = 0
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            match = _LINE.match(line.rstrip("\n"))
            if match is None:
                continue
            frames = [frame_name(f) for f in match[1].split(";") if f]
            if not frames or frames[-1].startswith("epoll_pwait"):
                continue
            count = int(match[2])
            busy += count
            own[frames[-1]] += count
            for name in set(frames):
                inclusive[name] += count
    return Profile(own, inclusive, busy)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stacks")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--against", help="a second profile of the same load")
    parser.add_argument("--requests", type=int, help="requests in each profile (with --against)")
    parser.add_argument("--min-share", type=float, default=1.0, help="percent of busy samples (with --against)")
    args = parser.parse_args()
    one = load(args.stacks)
    if one.busy == 0:
        print(f"{args.stacks}: no busy samples")
        return 1
    if args.against:
        if not args.requests:
            parser.error("--against needs --requests")
        other = load(args.against)
        per = 100 / args.requests
        print(f"busy samples per 100 requests: {one.busy * per:.1f} ({args.stacks}) against "
              f"{other.busy * per:.1f} ({args.against}): {100 * (one.busy / max(other.busy, 1) - 1):+.1f} %")
        names = {n for p in (one, other) for n, c in p.inclusive.items() if c >= p.busy * args.min_share / 100}
        print(f"{'this':>7} {'other':>7} {'diff':>7}  function (inclusive samples per 100 requests)")
        for name in sorted(names, key=lambda n: -max(one.inclusive[n], other.inclusive[n])):
            if _NOISE.search(name):
                continue
            a, b = one.inclusive[name] * per, other.inclusive[name] * per
            print(f"{a:7.1f} {b:7.1f} {a - b:+7.1f}  {name}")
        return 0
    print(f"{one.busy} busy samples")
    print(f"{'self %':>7} {'incl %':>7}  function")
    for name, count in one.inclusive.most_common(args.top):
        print(f"{100 * one.own[name] / one.busy:7.1f} {100 * count / one.busy:7.1f}  {name}")
    print("-- by self time")
    for name, count in one.own.most_common(args.top):
        print(f"{100 * count / one.busy:7.1f} {100 * one.inclusive[name] / one.busy:7.1f}  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
