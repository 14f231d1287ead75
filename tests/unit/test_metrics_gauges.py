"""/metrics when storage cannot be read: the rest of the scrape, and a gauge saying so."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

from collector.app import _node_gauges
from storage.env import Storage


def _families(storage: Storage) -> dict[str, float]:
    services = SimpleNamespace(workers=1, storage=storage, now_ms=lambda: int(time.time() * 1000))
    return {
        family.name: family.samples[0].value if family.samples else 0.0
        for family in _node_gauges(services)  # type: ignore[arg-type]
    }


def test_a_storage_read_that_fails_leaves_the_rest_of_the_scrape(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    read = _families(storage)
    assert read["collector_storage_gauges_read"] == 1 and "collector_outbox_entries" in read
    storage.close()  # every read fails now, as on a damaged page (helper-95: /metrics raised)
    failed = _families(storage)
    assert failed == {"collector_workers": 1, "collector_storage_gauges_read": 0}
