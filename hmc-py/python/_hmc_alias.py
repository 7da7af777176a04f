"""The interpreter's start-up hook of the ``hmc`` wheel (``hmc_alias.pth``): nothing unless
``HMC_ALIAS`` names packages to alias, ``nixl`` and/or ``mooncake`` (comma-separated); then
``import nixl`` and ``import mooncake.engine`` resolve to ``hmc.nixl`` and ``hmc.mooncake``
in this process and in its children (they inherit the variable).

The alias is lazy: the hook only puts a finder on ``sys.meta_path``; nothing is imported and
nothing enters ``sys.modules`` until the program itself imports the name (stacks test
``"nixl" in sys.modules`` to learn whether NIXL was imported before them: vLLM does, to set
UCX variables first). With the real package installed, the first import gets the real one
and a line on stderr says why, unless ``HMC_ALIAS_OVERRIDE=1``. This module imports nothing
of hmc (or of anything outside the standard library) at start-up."""

import os
import sys

# Per aliased top-level name, the names an import may ask for; each resolves, on first use,
# to the module of the same place in hmc (set by that module's ``install_alias``).
_NAMES = {
    "nixl": ("nixl", "nixl._api", "nixl._bindings", "nixl._utils", "nixl.logging"),
    "mooncake": ("mooncake", "mooncake.engine"),
}
# The hmc module whose ``install_alias`` puts every name of a top-level package in place.
_INSTALLER = {"nixl": "hmc.nixl", "mooncake": "hmc.mooncake"}


class _AliasLoader:
    """Returns the hmc module that ``install_alias`` put under the name (no code runs a
    second time) and leaves that module's own ``__spec__`` in place."""

    def __init__(self, top: str):
        self.top = top

    def create_module(self, spec):
        if not getattr(sys.modules.get(self.top), "__hmc_alias__", False):
            import importlib

            importlib.import_module(_INSTALLER[self.top]).install_alias(override=True)
        module = sys.modules[spec.name]
        self._own_spec = getattr(module, "__spec__", None)
        return module

    def exec_module(self, module):
        # The import system stamped the alias's spec on the module; give back its own.
        if self._own_spec is not None:
            module.__spec__ = self._own_spec


class _AliasFinder:
    """Finds the aliased names (first on ``sys.meta_path``) unless the real package is
    installed and not overridden."""

    __hmc_alias__ = True

    def __init__(self, tops, override: bool):
        self.tops = tuple(tops)
        self.override = override
        self._refused = set()

    def _real(self, top: str):
        """Where another finder finds ``top``, if one does."""
        for finder in sys.meta_path:
            if getattr(finder, "__hmc_alias__", False) or not hasattr(finder, "find_spec"):
                continue
            try:
                spec = finder.find_spec(top, None)
            except Exception:  # noqa: BLE001 (a finder that fails finds nothing)
                spec = None
            if spec is not None:
                return spec.origin or str(spec.submodule_search_locations)
        return None

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.partition(".")[0]
        if top not in self.tops or fullname not in _NAMES[top] or top in self._refused:
            return None
        if fullname == top and not self.override:
            where = self._real(top)
            if where is not None:
                self._refused.add(top)
                print(
                    f"hmc: HMC_ALIAS={top}: the real `{top}` package is installed ({where}); "
                    "it is used, not hmc's work-alike (set HMC_ALIAS_OVERRIDE=1 to override)",
                    file=sys.stderr,
                )
                return None
        import importlib.machinery

        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(top), is_package=fullname == top)


def _run() -> None:
    want = [w.strip() for w in os.environ.get("HMC_ALIAS", "").split(",") if w.strip()]
    if not want:
        return
    tops = []
    for name in want:
        if name in _NAMES:
            tops.append(name)
        else:
            print(f"hmc: HMC_ALIAS names `{name}`; it can name nixl and mooncake", file=sys.stderr)
    if tops:
        sys.meta_path.insert(0, _AliasFinder(tops, os.environ.get("HMC_ALIAS_OVERRIDE") == "1"))


_run()
