"""Serving: index versions, the scoring kernel, the engine and the Celery fan-out."""
