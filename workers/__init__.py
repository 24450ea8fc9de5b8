"""Celery workers: score index shards, reindex nightly, train; Redis is the broker and result backend."""
