# PACE Stage II (paper Table 3): from Stage I's step 2,000, its LoRA merged, the whole language model trains
# (vision tower and projector frozen) with dot-product logits (eq. 2) at tau 100 and lr 2e-6; the Focal
# Embedding Loss keeps its cosine confidence (eq. 4) at tau_w 0.1.
#   torchrun --nproc_per_node=8 train.py config/stage2.py
out_dir = "out/stage2"
init_from = "out/stage1/step_002000"
learning_rate = 2e-6
similarity = "dot"
temperature = 100.0
lora_rank = 0
keep_checkpoints = []
