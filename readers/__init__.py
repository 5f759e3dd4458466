"""readers/: the downloads as users have them (mmE5, MMEB-train, MMEB-eval v1 and V2, mined files), read into the
prepared training table (training.py) or into evaluation rows (evaluation.py); MMEB's tables (mmeb.py)."""
