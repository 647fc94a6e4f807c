"""Free ports: below the kernel's ephemeral range, never the same one twice in a process, a baseline's
candidate port free beside it."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from specwatch.net import LOWEST, ephemeral_range, free_port, free_port_pair
from specwatch.stack.up import free_ports


def test_free_port_never_hands_out_a_port_twice() -> None:
    # the kernel draws bind(0) ports at random from ~28k: 1,000 draws repeat one with probability ~1 - e**-18
    ports = [free_port() for _ in range(1000)]
    assert len(set(ports)) == len(ports)


def test_ports_lie_below_the_range_the_kernel_gives_outgoing_connections() -> None:
    ephemeral = ephemeral_range()
    if ephemeral is None or ephemeral[0] - LOWEST < 1000:  # not Linux, or a range widened down: bind(0) picks
        pytest.skip(f"no room below the ephemeral range {ephemeral}")
    ports = [free_port() for _ in range(100)] + [free_port_pair() + 1 for _ in range(100)]
    assert all(LOWEST <= p < ephemeral[0] for p in ports), [p for p in ports if not LOWEST <= p < ephemeral[0]]


def test_the_range_is_read_from_the_kernels_file_and_a_missing_file_is_none(tmp_path: Path) -> None:
    source = tmp_path / "ip_local_port_range"
    source.write_text("40000\t50000\n")
    assert ephemeral_range(source) == (40000, 50000)
    assert ephemeral_range(tmp_path / "absent") is None
    source.write_text("garbage\n")
    assert ephemeral_range(source) is None


def test_a_stack_gets_seven_distinct_ports_and_the_candidate_port_is_free() -> None:
    seen: set[int] = set()
    for _ in range(200):
        p = free_ports()
        mine = {p.vllm, p.vllm + 1, p.exporter, p.prometheus, p.locust, p.grafana, p.viewer}
        assert len(mine) == 7, p
        assert not mine & seen, p  # nor any port an earlier stack in this process was given
        seen |= mine
    pair = free_port_pair()
    with socket.socket() as s:
        s.bind(("127.0.0.1", pair + 1))  # raises if something holds it
    assert pair not in seen and pair + 1 not in seen
