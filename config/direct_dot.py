# Direct dot-product training (paper Sections 3.2 and 6, Figures 1, 2, 4 and 9): dot logits and full
# fine-tuning from the backbone in one stage, focal off (Appendix C.2), lr 2e-6 (Table 3's full-tuning rate).
# Figure 2(c)'s dot + full run; Figure 9 sets it beside the staged cos -> dot run (ablation_no_focal.py).
#   torchrun --nproc_per_node=8 train.py config/direct_dot.py
out_dir = "out/direct_dot"
similarity = "dot"
temperature = 100.0
lora_rank = 0
learning_rate = 2e-6
focal_gamma = 0.0
