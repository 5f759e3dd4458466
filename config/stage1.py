# PACE Stage I (paper Table 3): LoRA rank 32 on the language model, cosine logits (eq. 1) at tau 0.1, Focal
# Embedding Loss gamma 2, lr 2e-5, 5 % warmup, 5 hard negatives, bf16, one epoch: train.py's defaults, which
# this file names the outputs of. Put (or link) the release and the data where train.py's defaults look, or
# set init_from, train_data and image_dir here or on the command line.
#   torchrun --nproc_per_node=8 train.py config/stage1.py
# It keeps the checkpoints of steps 2,000 (Stage II starts there), 4,000 and 7,847 (Figure 6a).
out_dir = "out/stage1"
