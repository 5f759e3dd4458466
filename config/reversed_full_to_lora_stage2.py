# Figure 5, the reversed parameter schedule, Stage II: fresh rank-32 LoRA with dot logits at tau 100, lr 2e-5.
out_dir = "out/reversed_full_to_lora_stage2"
init_from = "out/reversed_full_to_lora_stage1/step_002000"
similarity = "dot"
temperature = 100.0
keep_checkpoints = []
