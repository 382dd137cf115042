"""requirements.lock (what `make setup` installs) pins every package exactly and meets
pyproject.toml's ranges; environment.yml installs that same lock."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"
PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][A-Za-z0-9.!]*)")


def lock_lines() -> list[str]:
    return [line for line in LOCK.read_text().splitlines()
            if line.strip() and not line.startswith("#")]


def locked() -> dict[str, Version]:
    pins = {}
    for line in lock_lines():
        m = PIN.fullmatch(line)
        assert m, f"not an exact pin: {line!r}"
        pins[canonicalize_name(m[1])] = Version(m[2])
    return pins


def lock_python() -> str:
    """major.minor of the Python the lock was made with, from its header."""
    m = re.search(r"^# Python (\d+\.\d+)\.\d+ ", LOCK.read_text(), re.M)
    assert m, "the lock's header names no Python version"
    return m[1]


def test_every_line_of_the_lock_is_an_exact_pin_without_build_tag():
    lines = lock_lines()
    assert len(locked()) == len(lines), "a package is pinned twice"
    assert not [line for line in lines if "+" in line]  # torch==2.13.0, not 2.13.0+cpu


def test_the_lock_pins_what_make_setup_installs_first():
    assert {"pip", "torch"} <= locked().keys()


def test_the_lock_meets_every_range_in_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    reqs += [Requirement(r) for extra in project["optional-dependencies"].values()
             for r in extra]
    pins = locked()
    missing = [str(r) for r in reqs if canonicalize_name(r.name) not in pins]
    assert not missing, f"not in the lock (run `make lock`): {missing}"
    unmet = [f"{r} (locked {pins[canonicalize_name(r.name)]})" for r in reqs
             if not r.specifier.contains(pins[canonicalize_name(r.name)], prereleases=True)]
    assert not unmet, f"the lock is outside pyproject's ranges (run `make lock`): {unmet}"


def test_environment_yml_installs_the_lock_and_nothing_else():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    deps = env["dependencies"]
    conda = [d for d in deps if isinstance(d, str)]
    pip = [d["pip"] for d in deps if isinstance(d, dict)]
    assert conda == [f"python={lock_python()}", "pip"]
    assert pip == [[f"-r {LOCK.name}"]]
