# Toy Stage II: from toy Stage I's step 100, LoRA merged, full language model, dot product at tau 100.
#   python train.py config/shapes_stage2.py
import os
exec(open(os.path.join(os.path.dirname(__file__), "shapes_stage1.py")).read())
out_dir = "out/shapes_stage2"
init_from = "out/shapes_stage1/step_000100"
similarity = "dot"
temperature = 100.0
lora_rank = 0
learning_rate = 2e-4
keep_checkpoints = []
