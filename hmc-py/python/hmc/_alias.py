"""The opt-in aliases: ``import nixl`` (and its submodules) or ``import mooncake.engine``
resolving to ``hmc.nixl`` or ``hmc.mooncake`` in this process, so that unmodified code runs
on hmc. Off unless asked (:func:`hmc.nixl.install_alias`, :func:`hmc.mooncake.install_alias`,
or ``HMC_ALIAS=nixl,mooncake`` in the environment, read at interpreter start-up by the
wheel's ``hmc_alias.pth``); refused when the real package is installed unless
``override=True``."""

from __future__ import annotations

import importlib.machinery
import logging
import sys
import types

_log = logging.getLogger("hmc.alias")


def _real(name: str) -> str | None:
    """Where the real top-level package ``name`` is installed, if it is (and not ours)."""
    if name in sys.modules:
        m = sys.modules[name]
        return None if getattr(m, "__hmc_alias__", False) else getattr(m, "__file__", "(imported)")
    for finder in sys.meta_path:
        if getattr(finder, "__hmc_alias__", False):
            continue  # the start-up hook's lazy finder (_hmc_alias) finds ours, not a real one
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        try:
            spec = find(name, None)
        except Exception:  # noqa: BLE001 (a finder that fails finds nothing)
            spec = None
        if spec is not None:
            return spec.origin or str(spec.submodule_search_locations)
    return None


def install(top: str, modules: dict[str, types.ModuleType], override: bool) -> None:
    """Makes ``modules`` (full names under ``top``) importable under those names."""
    if getattr(sys.modules.get(top), "__hmc_alias__", False):
        return
    where = _real(top)
    if where is not None and not override:
        raise RuntimeError(
            f"the real `{top}` package is installed ({where}); hmc's alias would hide it: pass "
            f"override=True (or set HMC_ALIAS_OVERRIDE=1) to use hmc's in its place"
        )
    for name, mod in modules.items():
        sys.modules[name] = mod
    sys.modules[top].__hmc_alias__ = True
    _log.warning("`import %s` resolves to hmc's work-alike (%s) in this process", top, modules[top].__name__)


def package(name: str, **attrs) -> types.ModuleType:
    """An empty package module ``name`` with ``attrs`` (for ``mooncake``, whose only part
    hmc carries is ``mooncake.engine``)."""
    m = types.ModuleType(name, f"hmc's stand-in for the `{name}` package")
    m.__path__ = []
    m.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    for k, v in attrs.items():
        setattr(m, k, v)
    return m


__all__ = ["install", "package"]
