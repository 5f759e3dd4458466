"""runs/: an out_dir and what it holds: the step folders and their checks (checkpoint.py), the lock, the stop
signals, the resume check and the log (outdir.py), the export with its model card and every loader (export.py)."""
