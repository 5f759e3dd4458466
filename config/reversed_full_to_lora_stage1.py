# Figure 5, the reversed parameter schedule (LoRA -> full beats full -> LoRA by 7.3), Stage I: the whole
# language model with cosine logits at tau 0.1, lr 2e-6 (Table 3's full-tuning rate).
#   torchrun --nproc_per_node=8 train.py config/reversed_full_to_lora_stage1.py
#   torchrun --nproc_per_node=8 train.py config/reversed_full_to_lora_stage2.py
out_dir = "out/reversed_full_to_lora_stage1"
lora_rank = 0
learning_rate = 2e-6
