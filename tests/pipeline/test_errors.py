"""One exception tree: every exception class of our packages derives from ``LlmsloError``,
and every public one is drawn in the tree of :mod:`pipeline.errors`.

Interruptions are not errors: a ``BaseException`` that is no ``Exception`` (the drill's
``FleetStopped``, a ``KeyboardInterrupt`` so that no ``except Exception`` swallows it) stays
outside the tree.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pipeline.errors
from pipeline.errors import LlmsloError

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pipeline", "collectors", "simulator", "slo", "alerts", "api", "dashboards", "llmslo")


def _exception_classes() -> list[type[Exception]]:
    """Every exception class defined (not imported) in a module of our packages."""
    found: list[type[Exception]] = []
    for package in PACKAGES:
        modules = [package] + [
            info.name for info in pkgutil.walk_packages([str(ROOT / package)], f"{package}.")
        ]
        for name in modules:
            module = importlib.import_module(name)
            found += [
                cls
                for _, cls in inspect.getmembers(module, inspect.isclass)
                if issubclass(cls, Exception) and cls.__module__ == name
            ]
    return found


def test_every_exception_we_define_derives_from_llmslo_error() -> None:
    classes = _exception_classes()
    outside = sorted(
        f"{c.__module__}.{c.__qualname__}" for c in classes if not issubclass(c, LlmsloError)
    )
    assert len(classes) > 20  # the walk reached the packages
    assert outside == []


def test_every_public_exception_is_drawn_in_the_tree() -> None:
    drawn = set(re.findall(r"[├└]── (\w+)", pipeline.errors.__doc__ or ""))
    public = {c.__name__ for c in _exception_classes() if not c.__name__.startswith("_")}
    assert sorted(public - drawn - {"LlmsloError"}) == []


def test_no_two_exception_classes_share_a_name() -> None:
    names = [c.__name__ for c in _exception_classes()]
    assert sorted({n for n in names if names.count(n) > 1}) == []
