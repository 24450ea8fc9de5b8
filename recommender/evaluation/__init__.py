"""Evaluation: metrics, the rerank and knowledge-base protocols, the Table 5 experiment grid, reports."""
