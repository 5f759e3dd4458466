"""tools/: what uses a trained embedder or draws what it did: search.py, mining (mine.py) and its judge (judge.py),
the geometry diagnostics (geometry.py), the pictures (plot.py, matplotlib). Run each as python -m tools.NAME."""
