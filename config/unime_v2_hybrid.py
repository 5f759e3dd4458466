# This codebase's UniME-V2 hybrid: the paper's description of the baseline ("MLLM-judge InfoNCE", under Stage I's
# settings) read as InfoNCE at Stage I's tau 0.1 (gamma 0, as VLM2Vec) plus the exact symmetric KL to the judge's soft
# labels (tau_j 0.02, no floor), weight 1 each (loss.py, eqs. U1-U4). config/unime_v2.py is UniME-V2's released
# objective; this one keeps the contrastive term that the paper's other rows train with. Mine and judge first, as
# there, then:
#   torchrun --nproc_per_node=8 train.py config/unime_v2_hybrid.py
out_dir = "out/unime_v2_hybrid"
train_data = ["data/mined/mmE5"]
focal_gamma = 0.0
soft_labels = "judge"
judge_temperature = 0.02
infonce_weight = 1.0
alignment_weight = 1.0
alignment_floor = 0.0
