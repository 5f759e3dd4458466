# PACE Stage I (paper Table 3): LoRA rank 32 on the language model, cosine logits (eq. 1) at tau 0.1,
# Focal Embedding Loss gamma 2, lr 2e-5, 5 % warmup, 5 hard negatives, bf16, one epoch.
#   torchrun --nproc_per_node=8 train.py config/stage1.py --init_from=/models/Qwen3.5-0.8B-Base
# Table 3's "batch size 32" is per GPU on 8 GPUs (DeepSpeed's per-device batch): one epoch of ~2.0M
# rows at a global 256 is ~7,847 steps, the step the paper calls Stage I's convergence.
out_dir = "out/stage1"
init_from = "models/Qwen3.5-0.8B-Base"  # a local Hugging Face folder (or Qwen3.5-2B-Base)
train_data = ["data/mmE5/train.parquet"]  # your mmE5-synthetic / MMEB-train files; (path, max_rows) caps one
image_dir = "data/mmE5/images"
batch_size = 256
max_iters = 7847
learning_rate = 2e-5
warmup_ratio = 0.05
similarity = "cos"
temperature = 0.1
focal_gamma = 2.0
focal_temperature = 0.1
lora_rank = 32
lora_alpha = 64
num_hard_negatives = 5
max_length = 8192
max_pixels = 1605632
dtype = "bfloat16"
activation_checkpointing = True  # recompute each decoder layer in backward: the paper batch needs it at 80 GB (bench.py)
num_workers = 8  # per rank: a worker spends about 0.8 s on a 32-row batch of MMEB-shaped data (bench.py, section 4)
checkpoint_interval = 500
keep_checkpoints = [2000]  # Stage II starts from Stage I's step 2,000 (not the converged one: Figure 6a)
