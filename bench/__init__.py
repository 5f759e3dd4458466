"""bench/: speed against the floor and start-up (bench.py, synthetic.py), fla's kernels checked (fla_check.py), the
GPU run (gpu.sh) and the figures measured (RESULTS.md). Run as python -m bench.bench."""
