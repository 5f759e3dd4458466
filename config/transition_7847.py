# Figures 6(a) and 8: Stage II from the focal-off Stage I (the VLM2Vec run) at step 7847, its end (converged), focal off
# (Appendix C.3). The transition at step 2,000 is ablation_no_focal.py. Figure 8 tracks MMEB along Stage II:
# evaluate its step folders, e.g. python eval.py --init_from=out/transition_7847/step_004000 ...
#   torchrun --nproc_per_node=8 train.py config/vlm2vec.py && torchrun --nproc_per_node=8 train.py config/transition_7847.py
out_dir = "out/transition_7847"
init_from = "out/vlm2vec/step_007847"
learning_rate = 2e-6
similarity = "dot"
temperature = 100.0
lora_rank = 0
focal_gamma = 0.0
keep_checkpoints = [2000, 4000, 6000]
