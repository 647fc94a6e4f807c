"""Free ports: never the same one twice in a process, a baseline's candidate port free beside it."""

from __future__ import annotations

import socket

from specwatch.net import free_port, free_port_pair
from specwatch.stack.up import free_ports


def test_free_port_never_hands_out_a_port_twice() -> None:
    # the kernel draws bind(0) ports at random from ~28k: 1,000 draws repeat one with probability ~1 - e**-18
    ports = [free_port() for _ in range(1000)]
    assert len(set(ports)) == len(ports)


def test_a_stack_gets_six_distinct_ports_and_the_candidate_port_is_free() -> None:
    seen: set[int] = set()
    for _ in range(200):
        p = free_ports()
        mine = {p.vllm, p.vllm + 1, p.exporter, p.prometheus, p.locust, p.grafana}
        assert len(mine) == 6, p
        assert not mine & seen, p  # nor any port an earlier stack in this process was given
        seen |= mine
    pair = free_port_pair()
    with socket.socket() as s:
        s.bind(("127.0.0.1", pair + 1))  # raises if something holds it
    assert pair not in seen and pair + 1 not in seen
