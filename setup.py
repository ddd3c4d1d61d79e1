"""Build hook only (the metadata is in pyproject.toml): the wheel carries the systemd units,
sysusers and tmpfiles files, the PAM service, the logrotate file, the example configurations,
the docs and the certificate scripts as package data under ``mcpd/share/`` (``systemd/``, ``etc/``,
``docs/``, ``certs/``), which ``mcpd install-systemd`` puts where the units expect them. A
checkout (``pip install -e .``) reads the same folders at the repository's top instead. The
Ansible role (``etc/ansible/``) runs on the controller, from a checkout or the sdist: nothing
installs it from a wheel, so the wheel leaves it out (:data:`LEFT_OUT`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SHARED = ("systemd", "etc", "docs", "certs")
LEFT_OUT = (ROOT / "etc" / "ansible",)  # folders of SHARED the wheel does not carry


class BuildPyWithShare(build_py):
    """``build_py``, then copy :data:`SHARED` into ``<build_lib>/mcpd/share/``."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        share = Path(self.build_lib) / "mcpd" / "share"
        patterns = shutil.ignore_patterns("__pycache__", "*.pyc", "*.key")

        def ignore(folder: str, names: list[str]) -> set[str]:
            return set(patterns(folder, names)) | {n for n in names if Path(folder, n) in LEFT_OUT}

        for name in SHARED:
            if (ROOT / name).is_dir():
                shutil.copytree(ROOT / name, share / name, dirs_exist_ok=True, ignore=ignore)


setup(cmdclass={"build_py": BuildPyWithShare})
