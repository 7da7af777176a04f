"""``nixl.logging`` on hmc: loggers under ``nixl`` (NIXL's name, so that a stack's logging
configuration for NIXL applies), printing to stdout at INFO, with ``NIXL_LOG_LEVEL``
(``TRACE``, ``DEBUG``, ``INFO``, ``WARN``, ``ERROR``, ``FATAL``) and ``NIXL_DEBUG_LOGGING``
read as NIXL 1.5.1 reads them; the same names (``LOGGING_CONFIG``, ``setup_logging``,
``set_log_level_by_env``, ``get_logger``)."""

import logging
import logging.config
import os

_logging_configured = False

LOGGING_CONFIG = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "simpleFormatter": {
            "format": "%(asctime)s NIXL %(levelname)-7s %(filename)s:%(lineno)d %(message)s",
            "datefmt": "%Y-%m-%d %H:%M:%S",
        }
    },
    "handlers": {
        "consoleHandler": {
            "class": "logging.StreamHandler",
            "level": "INFO",
            "formatter": "simpleFormatter",
            "stream": "ext://sys.stdout",
        }
    },
    "loggers": {"nixl": {"level": "INFO", "handlers": ["consoleHandler"], "propagate": False}},
}

# NIXL_LOG_LEVEL's words (NIXL's C++ levels) as Python's.
_LEVELS = {
    "TRACE": logging.DEBUG,
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARN": logging.WARNING,
    "ERROR": logging.ERROR,
    "FATAL": logging.CRITICAL,
}


def set_log_level_by_env(nixl_logger: logging.Logger) -> None:
    """Sets ``nixl_logger``'s level from ``NIXL_LOG_LEVEL`` when set; an unknown word is
    warned about and the configured level kept."""
    word = os.getenv("NIXL_LOG_LEVEL")
    if not word:
        return
    level = _LEVELS.get(word.upper())
    if level is None:
        nixl_logger.warning(
            "Invalid NIXL_LOG_LEVEL value '%s': use one of %s. Using configuration default.",
            word,
            ", ".join(_LEVELS),
        )
        return
    nixl_logger.setLevel(level)
    nixl_logger.info("Log level set to %s from NIXL_LOG_LEVEL environment variable", word.upper())


def setup_logging() -> None:
    """Configures the ``nixl`` logger once (``LOGGING_CONFIG``, then ``NIXL_LOG_LEVEL``)."""
    global _logging_configured
    if _logging_configured:
        return
    logging.config.dictConfig(LOGGING_CONFIG)
    set_log_level_by_env(logging.getLogger("nixl"))
    logging.raiseExceptions = os.getenv("NIXL_DEBUG_LOGGING", "").lower() in ("true", "1", "yes")
    _logging_configured = True


def get_logger(name: str) -> logging.Logger:
    """The logger ``nixl.<name>`` (leading underscores dropped), configured once."""
    setup_logging()
    return logging.getLogger(f"nixl.{name.lstrip('_')}")
