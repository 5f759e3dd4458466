# Table 7: PACE with focal gamma 4.0 in both stages, Stage I (the paper's gamma is 2.0).
#   torchrun --nproc_per_node=8 train.py config/gamma4.0_stage1.py && ... config/gamma4.0_stage2.py
out_dir = "out/gamma4.0_stage1"
focal_gamma = 4.0
