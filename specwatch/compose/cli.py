"""The `specwatch images` verb: `base` (the local Debian base alone) and `build` (inputs, base, every image).

Exit codes: 0 built, 1 a docker, debootstrap or compose failure (its message on stderr), 2 a usage error.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from specwatch.compose import images
from specwatch.compose.docker_cli import DockerError
from specwatch.config import Home
from specwatch.exit_codes import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from specwatch.vllm_cpu.setup import is_installed


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "Exit codes: 0 built, 1 a docker / debootstrap / compose failure, 2 usage."
    actions = parser.add_subparsers(dest="action", required=True)
    base = actions.add_parser("base", help=f"build {images.LOCAL_BASE} with debootstrap (root) and docker import")
    base.add_argument("--mirror", default=images.DEBIAN_MIRROR, help="Debian mirror for debootstrap")
    base.add_argument("--force", action="store_true", help="rebuild even if the image exists")
    build = actions.add_parser(
        "build", help="stage build inputs, pick the base (official, else local), docker compose build",
        description="Builds the images of compose.yaml for the given profiles. Where the official Python image "
                    f"cannot be pulled, {images.LOCAL_BASE} is built and used, and {images.OFFLINE_FILE} is "
                    "added (Prometheus from Debian's package, no Grafana).")
    build.add_argument("--root", type=Path, default=Path.cwd(), help="the checkout (compose.yaml); default: here")
    build.add_argument("--base", default="auto", help="auto (default), official, local, or an image name")
    build.add_argument("--profile", action="append", choices=["cpu", "sim", "gpu"],
                       help="compose profiles whose images to build (repeatable; default cpu)")
    build.add_argument("--offline", action=argparse.BooleanOptionalAction, default=None,
                       help=f"add {images.OFFLINE_FILE} (default: exactly when the official base cannot be had)")
    build.add_argument("--ca-bundle", type=Path, help="CA bundle pip trusts in the build (default: pip's `cert`)")
    build.add_argument("--wheelhouse", type=Path, action="append",
                       help="folder of wheels for the build (repeatable; default: pip's `find-links`)")
    build.add_argument("--mirror", default=images.DEBIAN_MIRROR, help="Debian mirror for a local base")


def run(home: Home, args: argparse.Namespace) -> int:
    try:
        if args.action == "base":
            cfg = images.ImagesConfig(root=Path.cwd(), env=dict(os.environ), mirror=args.mirror)
            print(images.build_local_base(cfg, force=args.force))
            return EXIT_OK
        cfg = images.ImagesConfig(
            root=args.root.resolve(), env=dict(os.environ), base=args.base,
            profiles=tuple(args.profile or ("cpu",)), offline=args.offline, ca_bundle=args.ca_bundle,
            wheelhouses=tuple(args.wheelhouse or ()), mirror=args.mirror,
            vllm_python=home.vllm_python if is_installed(home) else None)
        if not (cfg.root / "compose.yaml").is_file():
            print(f"specwatch images: --root {cfg.root}: no compose.yaml there", file=sys.stderr)
            return EXIT_USAGE
        images.build(cfg)
        return EXIT_OK
    except DockerError as exc:
        print(f"specwatch images: {exc}", file=sys.stderr)
        return EXIT_ERROR
