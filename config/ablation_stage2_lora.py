# Ablation "w/ S2 LoRA" (paper Table 2): Stage II trains fresh rank-32 LoRA adapters on the merged model
# instead of the full language model; dot-product logits at tau 100 as in PACE.
import os
exec(open(os.path.join(os.path.dirname(__file__), "stage2.py")).read())
out_dir = "out/ablation_stage2_lora"
lora_rank = 32
lora_alpha = 64
