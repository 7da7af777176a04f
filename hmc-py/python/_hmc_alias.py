"""The interpreter's start-up hook of the ``hmc`` wheel (``hmc_alias.pth``): nothing unless
``HMC_ALIAS`` names packages to alias, ``nixl`` and/or ``mooncake`` (comma-separated); then
``import nixl`` and ``import mooncake.engine`` resolve to ``hmc.nixl`` and
``hmc.mooncake`` in this process and in its children (they inherit the variable). With the
real package installed it refuses (says so on stderr) unless ``HMC_ALIAS_OVERRIDE=1``.
This module imports nothing of hmc when the variable is unset."""

import os


def _run() -> None:
    want = [w.strip() for w in os.environ.get("HMC_ALIAS", "").split(",") if w.strip()]
    if not want:
        return
    override = os.environ.get("HMC_ALIAS_OVERRIDE") == "1"
    import sys

    for name in want:
        try:
            if name == "nixl":
                from hmc.nixl import install_alias
            elif name == "mooncake":
                from hmc.mooncake import install_alias
            else:
                print(f"hmc: HMC_ALIAS names `{name}`; it can name nixl and mooncake", file=sys.stderr)
                continue
            install_alias(override=override)
        except Exception as e:  # noqa: BLE001 (a start-up hook must not stop the interpreter)
            print(f"hmc: HMC_ALIAS={name}: {e}", file=sys.stderr)


_run()
