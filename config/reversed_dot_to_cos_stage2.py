# Figure 5, the reversed similarity schedule, Stage II: full fine-tuning with cosine logits at tau 0.1, lr 2e-6.
out_dir = "out/reversed_dot_to_cos_stage2"
init_from = "out/reversed_dot_to_cos_stage1/step_002000"
lora_rank = 0
learning_rate = 2e-6
keep_checkpoints = []
