"""One /metrics answer for every worker of `serve --workers N`.

The workers share one listening socket, so a scrape reaches whichever worker
accepted the connection. Each worker's own counters answered alone went up and
down from scrape to scrape (Prometheus read every drop as a counter reset), and
no scraper can pick a worker. So each worker writes a snapshot of its
per-process metrics to a directory the parent made, once a second and before
it answers a scrape, and the answer is every worker's snapshot, each sample
labelled `worker="I"`, plus the node-wide gauges (storage, outbox, meters)
once.

A worker answering a scrape first writes its own snapshot, then reads them all:
what one answer shows of a worker is never newer than what that worker has
written, so a later answer, from any worker, never shows a counter lower than
an earlier one did (until that worker restarts, a reset Prometheus expects).
Another worker's figures are at most about a second old.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import msgspec
import trio
from prometheus_client.metrics_core import Metric

PUBLISH_EVERY_S = 1.0


class _Sample(msgspec.Struct, array_like=True):
    name: str
    labels: dict[str, str]
    value: float  # (no timestamps: the collector's samples carry none)


class _Family(msgspec.Struct, array_like=True):
    name: str
    documentation: str
    type: str
    unit: str
    samples: list[_Sample]


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(list[_Family])


class SharedMetrics:
    def __init__(self, directory: str | os.PathLike[str], worker_index: int) -> None:
        self.directory = Path(directory)
        self.worker_index = worker_index
        self._published: list[_Family] = []  # what this worker last wrote (or nothing yet)

    def publish(self, families: Iterable[Metric]) -> None:
        """Write this worker's per-process families (atomically: a reader sees the old or the new)."""
        snapshot = _snapshot(families)
        path = self.directory / f"worker-{self.worker_index}.json"
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        self.directory.mkdir(mode=0o700, exist_ok=True)  # (removed by hand, or a tmp cleaner)
        partial.write_bytes(_encoder.encode(snapshot))
        os.replace(partial, path)
        self._published = snapshot

    def gather(self, *, unwritten: bool = False) -> list[Metric]:
        """Every worker's last snapshot, merged by family, each sample labelled with its worker.

        `unwritten`: this worker's snapshot could not be written just now; its
        last written one is shown, from memory (its file may be gone). Not its
        live figures: another worker's next answer reads the file, and a counter
        must not read lower there than here.
        """
        snapshots: list[tuple[str, list[_Family]]] = []
        if unwritten:
            snapshots.append((str(self.worker_index), self._published))
        for path in sorted(self.directory.glob("worker-*.json")):
            worker = path.stem.removeprefix("worker-")
            if unwritten and worker == str(self.worker_index):
                continue
            try:
                snapshots.append((worker, _decoder.decode(path.read_bytes())))
            except (OSError, msgspec.DecodeError):
                continue  # a worker that never finished its first write: nothing of it yet
        merged: dict[str, Metric] = {}
        for worker, snapshot in snapshots:
            for family in snapshot:
                metric = merged.get(family.name)
                if metric is None:
                    metric = merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                for sample in family.samples:
                    metric.add_sample(sample.name, {**sample.labels, "worker": worker}, sample.value)
        return list(merged.values())


def _snapshot(families: Iterable[Metric]) -> list[_Family]:
    return [
        _Family(
            family.name,
            family.documentation,
            family.type,
            family.unit,
            # (a NaN or infinite value would encode as null and hide the whole snapshot)
            [_Sample(s.name, dict(s.labels), s.value) for s in family.samples if math.isfinite(s.value)],
        )
        for family in families
    ]


async def publish_every_second(shared: SharedMetrics, families: Callable[[], Iterable[Metric]]) -> None:
    """Keep this worker's snapshot fresh for scrapes another worker answers."""
    while True:
        with contextlib.suppress(OSError):  # a full /tmp costs freshness, never the worker
            shared.publish(families())
        await trio.sleep(PUBLISH_EVERY_S)
