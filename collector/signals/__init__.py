"""Projections fed from the outbox: per-visitor state for signals snapshots."""
