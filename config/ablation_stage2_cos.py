# Ablation "w/o Dot" (paper Table 2): Stage II keeps cosine logits at tau 0.1; merged LoRA, full fine-tuning.
import os
exec(open(os.path.join(os.path.dirname(__file__), "stage2.py")).read())
out_dir = "out/ablation_stage2_cos"
similarity = "cos"
temperature = 0.1
