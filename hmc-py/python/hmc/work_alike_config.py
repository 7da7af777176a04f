"""The engine options that NIXL's and Mooncake's APIs cannot carry, for ``hmc.nixl`` and
``hmc.mooncake`` (and code run through their aliases): one TOML file named by
``HMC_CONFIG``, read by :func:`load` when an agent or engine starts. Its keys are
``hmc.Engine.initialize``'s options (``auth_secret_file``, ``no_progress_timeout_ms``,
``transport``, ``max_metadata_blob_len``, ...); a ``[nixl]`` or ``[mooncake]`` table
overrides them for that module::

    # hmc.toml: HMC_CONFIG=/etc/hmc.toml
    auth_secret_file = "/run/secrets/hmc"
    no_progress_timeout_ms = 2000
    [nixl]
    transport = "tcp"   # instead of the default choice NIXL's "UCX" maps to

``faults`` injects faults into the module's transfers, for a test of what the inference
stack does when they fail (docs/faults.md has the grammar; never on unless asked, and
logged at warn when on)::

    [nixl]
    faults = "seed=7;xfer.fail=first:1"   # the first transfer fails, the next ones do not
"""

from __future__ import annotations

import os
import tomllib

__all__ = ["load"]

# The largest configuration file read (a named limit: HMC_CONFIG names a small file).
MAX_CONFIG_BYTES = 1 << 20


def load(module: str) -> dict[str, str]:
    """The options for ``module`` (``"nixl"`` or ``"mooncake"``) from ``$HMC_CONFIG``: the
    top-level keys, then the module's table over them; ``{}`` without the variable. A file
    that cannot be read or parsed raises ``ValueError`` naming it."""
    path = os.environ.get("HMC_CONFIG")
    if not path:
        return {}
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise ValueError(f"HMC_CONFIG={path}: cannot read it ({e})") from e
    if len(raw) > MAX_CONFIG_BYTES:
        raise ValueError(f"HMC_CONFIG={path}: larger than MAX_CONFIG_BYTES ({MAX_CONFIG_BYTES} bytes)")
    try:
        doc = tomllib.loads(raw.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"HMC_CONFIG={path}: not TOML ({e})") from e
    out = {k: v for k, v in doc.items() if not isinstance(v, dict)}
    out.update(doc.get(module, {}))
    return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in out.items()}
