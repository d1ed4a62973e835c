"""Build the Docker sandbox image locally, without any registry.

Recipe: ``debootstrap --variant=minbase --include=<PACKAGES> bookworm`` into a temporary folder, trim
documentation and apt lists, pack the tree as a tarball cached under ``$AGENTENV_CACHE/sandbox/``
(so a second build skips the ~2 minute debootstrap), then ``docker import`` it with the user, working
folder and environment set (see ``sandboxes/docker/README.md``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from agentenv.errors import SandboxError
from agentenv.paths import cache_dir

IMAGE_REPO = "agentenv-sandbox"
IMAGE_TAG = "bookworm-1"  #: bump when the recipe below changes
IMAGE = f"{IMAGE_REPO}:{IMAGE_TAG}"
SUITE = "bookworm"
PACKAGES = ("python3", "python3-numpy", "python3-sympy")
MIRROR = os.environ.get("AGENTENV_DEBIAN_MIRROR", "http://deb.debian.org/debian")
CHANGES = [
    "USER 65534:65534",
    "WORKDIR /work",
    "ENV LANG=C.UTF-8",
    "ENV HOME=/tmp",
    "ENV PATH=/usr/local/bin:/usr/bin:/bin",
    'CMD ["python3"]',
]
_TRIM = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "var/cache/apt",
         "var/lib/apt/lists")


def rootfs_tarball() -> Path:
    """Where the debootstrap tarball is cached (``$AGENTENV_CACHE/sandbox/rootfs-<tag>.tar``)."""
    return cache_dir("sandbox") / f"rootfs-{IMAGE_TAG}.tar"


def build_rootfs(dest: Path, *, log=print) -> Path:
    """Debootstrap a minimal Debian with python3 and pack it into ``dest``.

    Raises:
        SandboxError: debootstrap is missing or failed (its last output lines are in the message).
    """
    if shutil.which("debootstrap") is None:
        raise SandboxError("debootstrap not found; run scripts/install_docker.sh "
                           "(apt-get install debootstrap)")
    with tempfile.TemporaryDirectory(prefix="agentenv-rootfs-") as tmp:
        root = Path(tmp) / "rootfs"
        cmd = ["debootstrap", "--variant=minbase", "--include=" + ",".join(PACKAGES), SUITE, str(root),
               MIRROR]
        log("sandbox image: " + " ".join(cmd))
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
            raise SandboxError(f"debootstrap failed (exit {proc.returncode}):\n{tail}")
        for rel in _TRIM:
            shutil.rmtree(root / rel, ignore_errors=True)
        (root / "work").mkdir(mode=0o1777, exist_ok=True)
        part = dest.with_suffix(".part")
        subprocess.run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(part), "."], check=True)
        part.replace(dest)
    return dest


def image_exists(client) -> bool:
    """True when the sandbox image is present in the daemon ``client`` talks to."""
    import docker.errors

    try:
        client.images.get(IMAGE)
        return True
    except docker.errors.ImageNotFound:
        return False


def build_image(client=None, *, force: bool = False, log=print) -> str:
    """Build (or find) the sandbox image and return its name.

    Args:
        client: A ``docker.DockerClient``; default ``docker.from_env()``.
        force: Rebuild the rootfs tarball and re-import even when the image exists.
        log: Where progress lines go.

    Raises:
        SandboxError: No Docker daemon answers, or debootstrap / import failed.
    """
    import docker

    try:
        client = client or docker.from_env()
        client.ping()
    except Exception as e:  # noqa: BLE001 - any failure means "no daemon"
        raise SandboxError(f"no Docker daemon answers ({e}); start one with scripts/install_docker.sh") from e
    if not force and image_exists(client):
        log(f"sandbox image: {IMAGE} already built")
        return IMAGE
    tar = rootfs_tarball()
    if force or not tar.is_file():
        build_rootfs(tar, log=log)
    else:
        log(f"sandbox image: reusing cached rootfs {tar}")
    log(f"sandbox image: docker import {tar} {IMAGE}")
    client.api.import_image(src=str(tar), repository=IMAGE_REPO, tag=IMAGE_TAG, changes=CHANGES)
    if not image_exists(client):
        raise SandboxError(f"docker import of {tar} did not produce {IMAGE}")
    return IMAGE
