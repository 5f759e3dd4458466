# Table 7: PACE with focal gamma 0.5 in both stages, Stage II (config/stage2.py's settings).
out_dir = "out/gamma0.5_stage2"
init_from = "out/gamma0.5_stage1/step_002000"
focal_gamma = 0.5
learning_rate = 2e-6
similarity = "dot"
temperature = 100.0
lora_rank = 0
keep_checkpoints = []
