"""Structured logs: one JSON object per line on stderr."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

import msgspec

from collector.log_sink import PIPE_BUF, stderr_sink
from storage.throttled_log import Throttle

_encoder = msgspec.json.Encoder()
_process_fields: dict[str, object] = {}  # on every line (configure_logging)


def process_fields() -> dict[str, object]:
    """What every log line of this process carries besides its own fields."""
    return _process_fields

# A line (its newline too) at most PIPE_BUF bytes: one write then, which `--workers`
# children sharing a stderr pipe cannot tear into each other (helper-109: a 12 KB
# warning had another worker's line inside it at byte 4096).
MAX_LINE_BYTES = PIPE_BUF - 1
# JSON leaves these raw inside strings: DEL and the C1 controls, which some terminals
# obey (U+009B starts an escape sequence), and the line breaks that readers splitting
# lines the Unicode way (Python's str.splitlines) cut a record at. Escaped, the line
# is the same JSON.
_ESCAPED = str.maketrans({code: f"\\u{code:04x}" for code in (*range(0x7F, 0xA0), 0x2028, 0x2029)})


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **_process_fields,
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return one_line(entry)


def one_line(entry: dict[str, object]) -> str:
    """`entry` as a JSON line of at most MAX_LINE_BYTES, its long strings cut in the
    middle as needed (a traceback keeps its first frames and its exception line)."""
    line = _encode(entry)
    if len(line.encode()) <= MAX_LINE_BYTES:
        return line
    whole = entry
    # several long fields share the room; then the longest gives up what is still over
    entry = {name: _middle(value, MAX_LINE_BYTES // 4) if isinstance(value, str) else value
             for name, value in entry.items()}
    for _ in range(8):
        line = _encode(entry)
        excess = len(line.encode()) - MAX_LINE_BYTES
        if excess <= 0:
            return line
        name = max((k for k, v in entry.items() if isinstance(v, str)), key=lambda k: len(str(entry[k])))
        value = str(entry[name])
        size = len(_encode(value))  # (as encoded: escapes and UTF-8 take more bytes than characters)
        entry[name] = _middle(value, max(0, len(value) * (size - excess) // size - 64))  # (64: the mark)
    kept = ("ts", "level", "logger", *_process_fields)
    return _encode({key: whole[key] for key in kept if key in whole} | {"msg": "(cut)"})


def _middle(value: str, keep: int) -> str:
    """`value` with its middle cut out, `keep` characters left."""
    if len(value) <= keep:
        return value
    return f"{value[: keep // 2]} [... {len(value) - keep} characters cut ...] {value[len(value) - (keep - keep // 2):]}"


def _encode(value: object) -> str:
    return safe_json_text(_encoder.encode(value).decode())


def safe_json_text(text: str) -> str:
    """JSON text with what JSON lets stand raw in a string escaped (DEL, the C1
    controls, U+2028/U+2029): the same JSON, safe on a terminal and in a reader
    that splits lines the Unicode way."""
    return text.translate(_ESCAPED)


class OncePerMinute(logging.Filter):
    """Lets a logger's message through at most once a minute per message, saying how
    many like it were held back since (hypercorn's "Error in ASGI Framework" with its
    traceback, for one, is a client's to repeat: helper-109 sent 500 in a second)."""

    def __init__(self, every_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._throttle = Throttle(clock, every_s=every_s)

    def filter(self, record: logging.LogRecord) -> bool:
        held = self._throttle.admit(str(record.msg))
        if held:
            record.msg = f"{record.msg} ({held} more like it since the last one were not logged)"
        return held is not None


class SinkHandler(logging.Handler):
    """Hands each formatted line to the stderr sink, which never blocks the caller."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + "\n"
        except Exception:  # noqa: BLE001 (as logging.StreamHandler: a bad record is reported, not raised)
            self.handleError(record)
            return
        stderr_sink().write(line.encode("utf-8", "backslashreplace"))


def configure_logging(level: int = logging.INFO, *, worker: int | None = None) -> None:
    """`worker`: the `serve --workers` child's index, which each of its lines carries
    with its pid (helper-109: the children's lines could not be told apart, so a
    supervisor's "worker 1 (pid X) exited" matched none of them)."""
    global _process_fields
    _process_fields = {} if worker is None else {"worker": worker, "pid": os.getpid()}
    fields = _encode(_process_fields)[1:-1]  # '"worker":1,"pid":7', or nothing
    stderr_sink().line_fields = "," + fields if fields else ""  # (for the line the sink writes itself)
    handler = SinkHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
