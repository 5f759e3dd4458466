# Table 7: PACE with focal gamma 0.5 in both stages, Stage I (the paper's gamma is 2.0).
#   torchrun --nproc_per_node=8 train.py config/gamma0.5_stage1.py && ... config/gamma0.5_stage2.py
out_dir = "out/gamma0.5_stage1"
focal_gamma = 0.5
