"""The pure ingest pipeline: bytes and context in, a decision out (no trio, quart or lmdb)."""

from collector.ingest.body import decompress_body
from collector.ingest.pipeline import prepare_batch, refuse_payment_data

__all__ = ["decompress_body", "prepare_batch", "refuse_payment_data"]
