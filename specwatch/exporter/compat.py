"""Every reach into aiohttp's and prometheus_client's private attributes, in one place, checked at import.

The tap's hot path does four things the libraries have no public API for: it adds an ITL histogram's
counts per bucket in one go (`Histogram` child's `_upper_bounds`, `_buckets`, `_sum`), it sends a
streamed response's held headers together with its first body bytes (aiohttp's `StreamWriter`
`_headers_buf`, `_send_headers_with_payload`, `StreamResponse._send_headers_immediately`), it marks a
response ended whose end the relay thread wrote (`ended_elsewhere`: what `write_eof` sets), and each
`--workers` process switches prometheus_client to multiprocess values (`values.ValueClass`). These
were written for the series in `WRITTEN_FOR` (pinned in pyproject.toml). Importing this module checks
both the versions and that every attribute is there, so a dependency bump stops the exporter at start
with a message naming what moved, instead of running on with wrong counts or split headers.
`tests/test_exporter_parts.py` checks that the results equal the public API's.
"""

from __future__ import annotations

import os
from importlib.metadata import version
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.http_writer import StreamWriter
from prometheus_client import CollectorRegistry, Histogram, values

WRITTEN_FOR = {"aiohttp": "3.14", "prometheus_client": "0.26"}


class IncompatibleDependency(ImportError):
    """A dependency's version or private layout is not the one this module was written for."""


def _series(version: str) -> str:
    return ".".join(version.split(".")[:2])


def check(versions: dict[str, str]) -> None:
    """Raise `IncompatibleDependency` unless each library's installed version is in the series written for."""
    for name, series in WRITTEN_FOR.items():
        found = versions.get(name, "")
        if _series(found) != series:
            raise IncompatibleDependency(
                f"specwatch.exporter.compat was written for {name} {series}.x and found {name} {found or 'none'}: "
                f"the tap reaches into its private attributes (see specwatch/exporter/compat.py); "
                f"install the version pinned in pyproject.toml, or port compat.py and its tests")


def _check_layout() -> None:
    """The private attributes exist where this module uses them (a patch release could still move one)."""
    child = Histogram("specwatch_compat_probe", "probe", registry=CollectorRegistry())
    missing = [f"prometheus_client Histogram.{name}" for name in ("_upper_bounds", "_buckets", "_sum")
               if not hasattr(child, name)]
    missing += [f"aiohttp StreamWriter.{name}" for name in ("_send_headers_with_payload", "send_headers")
                if not hasattr(StreamWriter, name)]
    missing += [f"aiohttp StreamResponse.{name}" for name in ("_eof_sent", "_payload_writer", "_req", "_body_length")
                if not hasattr(web.StreamResponse, name)]
    missing += [f"aiohttp StreamWriter.{name}" for name in ("_eof", "output_size") if not hasattr(StreamWriter, name)]
    if "_send_headers_immediately" not in vars(web.StreamResponse):
        missing.append("aiohttp StreamResponse._send_headers_immediately")
    if not hasattr(values, "ValueClass") or not hasattr(values, "MultiProcessValue"):
        missing.append("prometheus_client values.ValueClass / MultiProcessValue")
    if missing:
        raise IncompatibleDependency("specwatch.exporter.compat: private attributes moved: " + ", ".join(missing))


check({"aiohttp": aiohttp.__version__, "prometheus_client": version("prometheus_client")})
_check_layout()


# -- prometheus_client: a histogram child's buckets ---------------------------------------------------

def histogram_bounds(child: Any) -> list[float]:
    """The child's upper bounds, `+Inf` last (what `observe` walks)."""
    return list(child._upper_bounds)


def histogram_add(child: Any, counts: list[int], total: float) -> None:
    """Add `counts[i]` observations to bucket i and `total` to the sum, as that many `observe` calls would;
    `counts` is zeroed on the way."""
    buckets = child._buckets
    for i, n in enumerate(counts):
        if n:
            buckets[i].inc(n)
            counts[i] = 0
    if total:
        child._sum.inc(total)


def histogram_observe_at(child: Any, bucket: int, amount: float) -> None:
    """`observe(amount)` where the caller has found the amount's bucket already."""
    child._sum.inc(amount)
    child._buckets[bucket].inc(1)


def use_multiprocess_values(folder: Path) -> None:
    """prometheus_client's multiprocess mode for every metric created from here on in this process: values in
    mmap files under `folder` (the library reads its folder from the environment; this is the one place set)."""
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(folder)
    values.ValueClass = values.MultiProcessValue()


# -- aiohttp: headers that leave with the first body bytes --------------------------------------------

class HeldHeadersResponse(web.StreamResponse):
    """A streamed response whose headers wait in the writer (`prepare` does not send them) until its first
    body bytes or `writer.send_headers()`: headers and body bytes that arrived together leave in one write.
    aiohttp 3.14's `StreamResponse` sends its headers alone at `prepare`; its `Response` holds them this way."""

    _send_headers_immediately = False


def send_with_held_headers(writer: Any, data: bytes) -> bool:
    """Send the writer's held headers and `data` in one write (the writer frames `data` as a chunk where the
    body is chunked); False where no headers were held (the caller writes `data` itself)."""
    if isinstance(writer, StreamWriter) and writer._headers_buf:
        writer._send_headers_with_payload(data, False)
        return True
    return False


def ended_elsewhere(response: web.StreamResponse) -> None:
    """The response's body and its end were written past aiohttp (the relay thread wrote the end of the chunked
    body): mark it ended as `write_eof` would, without writing anything, so that aiohttp neither writes an end
    again nor treats the connection as cut; the connection stays keep-alive."""
    writer = response._payload_writer
    if isinstance(writer, StreamWriter):
        writer._eof = True
    response._eof_sent = True
    response._req = None
    response._body_length = writer.output_size if writer is not None else 0
    response._payload_writer = None
