"""NIXL's Python API on hmc: ``from hmc.nixl._api import nixl_agent`` where NIXL code says
``from nixl._api import nixl_agent`` (the one-name change, as ``rixl`` mirrors NIXL).

The layout mirrors the ``nixl`` package: :mod:`hmc.nixl._api` (the agent),
:mod:`hmc.nixl._bindings` (status codes, memory types, descriptor lists, exceptions),
:mod:`hmc.nixl._utils` and :mod:`hmc.nixl.logging`. An hmc agent talks to hmc agents, not to
NIXL processes: its metadata is refused by NIXL and NIXL's by it, by name. Calls of NIXL
that hmc does not carry (storage backends, device-side views) raise ``NotImplementedError``
naming the call and what to use.

One difference in what a state means: in NIXL, ``"ERR"`` from ``check_xfer_state`` does not
guarantee that the backend stopped its DMA (vLLM keeps such a handle forever for that
reason). In hmc, a transfer is not reported ``"ERR"``, and ``release_xfer_handle`` does not
return, until no byte of it can land in either agent's memory any more. So a failed handle
can be released, and its buffers reused, at once, over every transport (tcp, shm, ucx; the
limits of each are in docs/design.md, "Terminal states").
"""

from ._api import (
    DEFAULT_COMM_PORT,
    nixl_agent,
    nixl_agent_config,
    nixl_backend_handle,
    nixl_prepped_dlist_handle,
    nixl_thread_sync_t,
    nixl_xfer_handle,
)



def install_alias(override: bool = False) -> None:
    """Makes ``import nixl`` and its submodules (``nixl._api``, ``nixl._bindings``,
    ``nixl._utils``, ``nixl.logging``) resolve to ``hmc.nixl`` in this process, so NIXL code
    runs unchanged (``HMC_ALIAS=nixl`` does it at start-up, for child processes too).
    Refused when the real ``nixl`` is installed, unless ``override``."""
    import sys

    from .. import _alias
    from . import _bindings, _utils, logging

    me = sys.modules[__name__]
    _alias.install(
        "nixl",
        {"nixl": me, "nixl._api": sys.modules[__name__ + "._api"], "nixl._bindings": _bindings,
         "nixl._utils": _utils, "nixl.logging": logging},
        override,
    )


__all__ = [
    "install_alias",
    "DEFAULT_COMM_PORT",
    "nixl_agent",
    "nixl_agent_config",
    "nixl_backend_handle",
    "nixl_prepped_dlist_handle",
    "nixl_thread_sync_t",
    "nixl_xfer_handle",
]
