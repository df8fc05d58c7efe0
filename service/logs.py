"""Logs: readable lines on a terminal, one JSON object per line otherwise (or when asked).

Both carry any `extra={...}` fields. JSON lines never hold terminal colour codes (uvicorn's
`color_message` is dropped, escape sequences are stripped), and library chatter (alembic's migration
steps, faiss's SIMD choice) is kept to warnings.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import Any

_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "color_message",  # uvicorn's copy of the message with ANSI colours
}
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_QUIET = ("faiss.loader", "alembic", "alembic.runtime.migration", "huey", "numba")


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _RESERVED and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    """Machine-readable log lines (time, level, logger, message, extras, exception)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": _ANSI.sub("", record.getMessage()),
        }
        out.update(_extras(record))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class HumanFormatter(logging.Formatter):
    """`12:01:02 INFO  ovex.app  serving  models_dir=models threads=1`: for a person at a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        extras = " ".join(f"{k}={v}" for k, v in _extras(record).items())
        name = "uvicorn" if record.name == "uvicorn.error" else record.name  # its info lines are no errors
        line = f"{stamp} {record.levelname:<7} {name:<12} {record.getMessage()}"
        if extras:
            line += f"  {extras}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def use_json(json_lines: bool | None) -> bool:
    """JSON when asked (True), readable when asked (False); unset: JSON unless stderr is a terminal."""
    return not sys.stderr.isatty() if json_lines is None else json_lines


def configure_logging(level: str = "info", json_lines: bool | None = None) -> None:
    """Route the root, uvicorn and ovex loggers to stderr in one format."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if use_json(json_lines) else HumanFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in _QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers[:] = []
        lg.propagate = True


def uvicorn_log_config() -> dict[str, Any]:
    """A dictConfig that leaves uvicorn's loggers to the root handler set by `configure_logging`."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "loggers": {
            "uvicorn": {"handlers": [], "propagate": True},
            "uvicorn.error": {"handlers": [], "propagate": True},
            "uvicorn.access": {"handlers": [], "propagate": True},
        },
    }
