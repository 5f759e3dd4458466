# Figure 5, the reversed similarity schedule (cos -> dot beats dot -> cos by 2.9), Stage I: LoRA as PACE's, but
# dot-product logits at tau 100. Learning rates follow the parameter space as in Table 3 (LoRA 2e-5, full 2e-6).
#   torchrun --nproc_per_node=8 train.py config/reversed_dot_to_cos_stage1.py
#   torchrun --nproc_per_node=8 train.py config/reversed_dot_to_cos_stage2.py
out_dir = "out/reversed_dot_to_cos_stage1"
similarity = "dot"
temperature = 100.0
