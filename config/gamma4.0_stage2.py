# Table 7: PACE with focal gamma 4.0 in both stages, Stage II (config/stage2.py's settings).
out_dir = "out/gamma4.0_stage2"
init_from = "out/gamma4.0_stage1/step_002000"
focal_gamma = 4.0
learning_rate = 2e-6
similarity = "dot"
temperature = 100.0
lora_rank = 0
keep_checkpoints = []
