"""``nixl.logging``'s ``get_logger``: loggers under ``nixl`` (NIXL's name, so that a stack's
logging configuration for NIXL applies), printing to stdout at INFO unless
``NIXL_LOG_LEVEL`` says otherwise, as NIXL's do."""

import logging
import os
import sys

_configured = False


def get_logger(name: str) -> logging.Logger:
    """A logger named ``name`` under the ``nixl`` logger, configured once."""
    global _configured
    root = logging.getLogger("nixl")
    if not _configured:
        _configured = True
        if not root.handlers:
            h = logging.StreamHandler(sys.stdout)
            h.setFormatter(
                logging.Formatter(
                    "%(asctime)s NIXL %(levelname)-7s %(filename)s:%(lineno)d %(message)s",
                    "%Y-%m-%d %H:%M:%S",
                )
            )
            root.addHandler(h)
            root.propagate = False
        root.setLevel(os.getenv("NIXL_LOG_LEVEL", "INFO").upper())
    if name == "nixl" or name.startswith("nixl."):
        return logging.getLogger(name)
    return root.getChild(name)
