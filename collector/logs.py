"""Structured logs: one JSON object per line on stderr."""

from __future__ import annotations

import logging
import time

import msgspec

from collector.log_sink import stderr_sink

_encoder = msgspec.json.Encoder()


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return _encoder.encode(entry).decode()


class SinkHandler(logging.Handler):
    """Hands each formatted line to the stderr sink, which never blocks the caller."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + "\n"
        except Exception:  # noqa: BLE001 (as logging.StreamHandler: a bad record is reported, not raised)
            self.handleError(record)
            return
        stderr_sink().write(line.encode("utf-8", "backslashreplace"))


def configure_logging(level: int = logging.INFO) -> None:
    handler = SinkHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
