# The VLM2Vec baseline (paper Tables 1 and 4): Stage I's settings with plain InfoNCE (gamma 0): cosine, LoRA.
# It is also the focal-off Stage I of the experiments that disable focal weighting: the Stage II runs of
# "w/o focal" (ablation_no_focal.py) and Figures 6(a) and 8 (transition_*.py) start from its checkpoints,
# and it is Figure 2(c)'s cosine + LoRA run.
#   torchrun --nproc_per_node=8 train.py config/vlm2vec.py
out_dir = "out/vlm2vec"
focal_gamma = 0.0
