# Direct dot-product training (Sections 3.2 and 6): dot logits and full fine-tuning from the backbone,
# in one stage; the baseline whose angular-norm entanglement PACE avoids.
import os
exec(open(os.path.join(os.path.dirname(__file__), "stage1.py")).read())
out_dir = "out/direct_dot"
similarity = "dot"
temperature = 100.0
lora_rank = 0
learning_rate = 2e-6
keep_checkpoints = []
