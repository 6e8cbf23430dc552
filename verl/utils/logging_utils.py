"""The ``verl`` logger hierarchy and its one-time configuration.

Every module logs through ``get_logger(__name__)``, so all verl output hangs under the ``verl`` logger.
That logger gets a single stream handler (stderr) and its level from ``VERL_LOGGING_LEVEL`` the first
time a logger is requested, in the driver and in every worker process alike (the variable is
inherited through the environment). Child loggers keep level NOTSET and follow the ``verl`` level.

Records still propagate to the root logger, so ``pytest``'s ``caplog`` and a user's own root handlers
see them; if you add a handler on the root logger as well, a record is printed by both.
"""

from __future__ import annotations

import logging
import os

ROOT_LOGGER_NAME = "verl"
LEVEL_ENV_VAR = "VERL_LOGGING_LEVEL"
DEFAULT_LEVEL = logging.WARNING
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"

_LEVEL_NAMES = {name: getattr(logging, name) for name in
                ("CRITICAL", "FATAL", "ERROR", "WARNING", "WARN", "INFO", "DEBUG", "NOTSET")}

# Marks the handler we attach, so configuring twice (or re-importing) never adds a second one.
_HANDLER_FLAG = "_verl_handler"
_configured = False


def parse_level(value: str | int | None) -> int | None:
    """A logging level from a name (``info``, ``WARN``) or a number (``20``); None if not one."""
    if isinstance(value, int):
        return value
    if value is None:
        return None
    text = str(value).strip()
    if text.lstrip("-").isdigit():
        return int(text)
    return _LEVEL_NAMES.get(text.upper())


def configure_logging(level: str | int | None = None) -> logging.Logger:
    """Give the ``verl`` logger its stream handler (once) and set its level.

    ``level`` wins when given; otherwise ``VERL_LOGGING_LEVEL`` is read (default WARN). An invalid
    value logs a warning that names the variable and the accepted values, and the default is used.
    Safe to call any number of times; returns the ``verl`` logger.
    """
    global _configured
    _configured = True
    root = logging.getLogger(ROOT_LOGGER_NAME)
    if not any(getattr(h, _HANDLER_FLAG, False) for h in root.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(LOG_FORMAT, datefmt=DATE_FORMAT))
        setattr(handler, _HANDLER_FLAG, True)
        root.addHandler(handler)

    source = "level argument" if level is not None else LEVEL_ENV_VAR
    raw = level if level is not None else os.environ.get(LEVEL_ENV_VAR)
    parsed = parse_level(raw)
    root.setLevel(DEFAULT_LEVEL if parsed is None else parsed)
    if raw is not None and parsed is None:
        root.warning("%s=%r is not a logging level; using %s. Accepted: a name (%s) or a number.",
                     source, raw, logging.getLevelName(DEFAULT_LEVEL), ", ".join(sorted(_LEVEL_NAMES)))
    return root


# The original verl's name for the same step.
set_basic_config = configure_logging


def get_logger(name: str | None = None) -> logging.Logger:
    """A logger under the ``verl`` hierarchy; configures the hierarchy on the first call.

    Names already in the hierarchy (``verl``, ``verl.trainer...``, i.e. a module's ``__name__``) are
    used as they are; any other name (``__main__``, a user's script) becomes ``verl.<name>``.
    """
    if not _configured:
        configure_logging()
    if not name or name == ROOT_LOGGER_NAME:
        return logging.getLogger(ROOT_LOGGER_NAME)
    if not name.startswith(ROOT_LOGGER_NAME + "."):
        name = f"{ROOT_LOGGER_NAME}.{name}"
    return logging.getLogger(name)
