"""Grafana for the local stack, when a `grafana` binary is installed: the packaged provisioning,
with the datasource pointed at the local Prometheus and the dashboards read from the package data."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import yaml

from specwatch import resources
from specwatch.stack.processes import managed
from specwatch.supervisor import Supervisor


def grafana_binary() -> str | None:
    return shutil.which("grafana") or shutil.which("grafana-server")


def local_provisioning(folder: Path, prometheus_url: str, source: Path = resources.GRAFANA) -> Path:
    """A copy of the packaged provisioning with loopback URLs and the packaged dashboards folder."""
    out = folder / "provisioning"
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(source / "provisioning", out)
    for path in (out / "datasources").glob("*.y*ml"):
        doc: dict[str, Any] = yaml.safe_load(path.read_text())
        for ds in doc.get("datasources", []):
            if ds.get("type") == "prometheus":
                ds["url"] = prometheus_url
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
    for path in (out / "dashboards").glob("*.y*ml"):
        doc = yaml.safe_load(path.read_text())
        for provider in doc.get("providers", []):
            provider.setdefault("options", {})["path"] = str(source / "dashboards")
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def grafana_process(binary: str, folder: Path, prometheus_url: str, port: int, admin_password: str) -> Supervisor:
    provisioning = local_provisioning(folder, prometheus_url)
    env = {**os.environ, "GF_PATHS_PROVISIONING": str(provisioning), "GF_PATHS_DATA": str(folder / "data"),
           "GF_PATHS_LOGS": str(folder / "logs"), "GF_SERVER_HTTP_ADDR": "127.0.0.1",
           "GF_SERVER_HTTP_PORT": str(port), "GF_SECURITY_ADMIN_PASSWORD": admin_password,
           "GF_ANALYTICS_REPORTING_ENABLED": "false"}
    homepath = next((p for p in ("/usr/share/grafana", str(Path(binary).resolve().parents[1]))
                     if Path(p, "public").is_dir()), "/usr/share/grafana")
    argv = [binary, "server", "--homepath", homepath] if Path(binary).name == "grafana" else [binary, "--homepath",
                                                                                            homepath]
    return managed("grafana", argv, folder / "grafana.log", f"http://127.0.0.1:{port}/api/health", env)
