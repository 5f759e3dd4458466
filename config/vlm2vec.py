# VLM2Vec baseline (paper Table 4): Stage I's settings with plain InfoNCE (gamma 0), cosine, LoRA.
import os
exec(open(os.path.join(os.path.dirname(__file__), "stage1.py")).read())
out_dir = "out/vlm2vec"
focal_gamma = 0.0
keep_checkpoints = []
