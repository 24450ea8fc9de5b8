"""Words: the analyser, BM25, postings and the pre-filter backends behind one search face."""
