"""requirements.lock installs on every Python the project claims, down to the oldest (pyproject.toml's
requires-python, the Makefile's MIN_PYTHON: 3.11.2, Debian 12's python3.11). Read from the metadata of the
distributions installed here (no network): ``make check-oldest-python`` resolves the lock under that Python itself."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.support.paths import REPO


def _make_variable(name: str) -> str:
    match = re.search(rf"^{name} :?= (.*)$", (REPO / "Makefile").read_text(), re.MULTILINE)
    assert match, f"the Makefile sets no {name}"
    return match.group(1).strip()


def _pins() -> dict[str, str]:
    """requirements.lock's pins: canonical name -> version."""
    pins = {}
    for line in (REPO / "requirements.lock").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version.strip()
    return pins


OLDEST = Version(_make_variable("MIN_PYTHON"))


def test_requires_python_claims_the_makefiles_oldest_python_and_nothing_older():
    claimed = SpecifierSet(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"])
    older = Version(f"{OLDEST.major}.{OLDEST.minor}.{OLDEST.micro - 1}") if OLDEST.micro else Version("3.10.99")
    assert OLDEST in claimed and older not in claimed, f"requires-python {claimed} vs MIN_PYTHON {OLDEST}"


def test_lock_meets_the_constraints_make_lock_resolves_with():
    pins = _pins()
    for constraint in map(Requirement, _make_variable("LOCK_CONSTRAINTS").split()):
        pinned = pins[canonicalize_name(constraint.name)]
        assert constraint.specifier.contains(pinned), f"requirements.lock pins {constraint.name}=={pinned}"


def test_no_pinned_package_needs_a_newer_python_than_the_oldest_claimed():
    installed = {canonicalize_name(d.metadata["Name"]): d for d in importlib.metadata.distributions()}
    checked, too_new = 0, []
    for name, version in _pins().items():
        dist = installed.get(name)
        if dist is None or Version(dist.version).public != Version(version).public:
            continue  # not installed here at the pinned version: nothing to read
        checked += 1
        requires = dist.metadata.get("Requires-Python")
        if requires and not SpecifierSet(requires).contains(OLDEST, prereleases=True):
            too_new.append(f"{dist.metadata['Name']}=={version} (Requires-Python {requires})")
    assert checked > len(_pins()) // 2, f"only {checked} pinned packages are installed here at their pinned versions"
    assert too_new == [], f"these need a newer Python than {OLDEST}: {too_new}"
