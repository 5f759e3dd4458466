"""shapes/: the toy benchmark (prepare.py), the tiny Qwen3.5 it trains (tiny_model.py, pretrain.py) and the toy
study (study.py). Run each as python -m shapes.NAME."""
