# "PACE w/o Dot" (paper Table 2): Stage II keeps cosine logits at tau 0.1; merged LoRA, full fine-tuning, focal.
#   torchrun --nproc_per_node=8 train.py config/ablation_stage2_cos.py        # after config/stage1.py
out_dir = "out/ablation_stage2_cos"
init_from = "out/stage1/step_002000"
learning_rate = 2e-6
lora_rank = 0
keep_checkpoints = []
