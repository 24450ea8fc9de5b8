"""Tickets and labelled pairs: records, the SQLite store, importers, the synthetic generator."""
