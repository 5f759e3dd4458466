# Reversed parameter schedule (paper: LoRA->full beats full->LoRA by 7.3). Stage I fine-tunes the full
# language model (cosine, tau 0.1, lr 2e-6):
#   torchrun ... train.py config/reversed_full_to_lora.py
# then Stage II trains LoRA (dot, tau 100, lr 2e-5) from its step 2,000:
#   torchrun ... train.py config/stage2.py --init_from=out/reversed_full_stage1/step_002000 \
#       --lora_rank=32 --learning_rate=2e-5 --out_dir=out/reversed_lora_stage2
import os
exec(open(os.path.join(os.path.dirname(__file__), "stage1.py")).read())
out_dir = "out/reversed_full_stage1"
lora_rank = 0
learning_rate = 2e-6
