# "PACE w/o focal" (paper Table 2), and Figure 6(a)'s transition at step 2,000 (focal off, Appendix C.3):
# Stage II with plain InfoNCE, from the focal-off Stage I (the VLM2Vec run) at step 2,000.
#   torchrun --nproc_per_node=8 train.py config/vlm2vec.py && torchrun --nproc_per_node=8 train.py config/ablation_no_focal.py
out_dir = "out/ablation_no_focal"
init_from = "out/vlm2vec/step_002000"
learning_rate = 2e-6
similarity = "dot"
temperature = 100.0
lora_rank = 0
focal_gamma = 0.0
keep_checkpoints = []
