# Toy Stage II: from toy Stage I's step 100, LoRA merged, full language model, dot product at tau 100.
#   python train.py config/shapes_stage2.py
import os
exec(open(os.path.join(os.path.dirname(__file__), "shapes_stage1.py")).read())
out_dir = "out/shapes_stage2"
init_from = "out/shapes_stage1/step_000100"
similarity = "dot"
temperature = 6.4  # the tiny model's norms are sqrt(64) = 8: dot/6.4 matches cos/0.1 in scale (PACE.md on tau = 100)
lora_rank = 0
learning_rate = 5e-4  # full fine-tuning of the tiny model; 2e-4 gave 33.8 overall, 5e-4 37.2 (toy evaluation of 2026-11-29)
keep_checkpoints = []
