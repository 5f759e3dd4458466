# Table 6, PACE with GradCache (Appendix C.1), Stage I: a global batch of 1,024 in chunks of 8 items, the
# temperature divided by 5 (0.1 -> 0.02), the rest as Stage I. One epoch of ~2.0M rows is 1,953 steps at 1,024;
# Stage II starts from step 500, the 512,000 rows Stage I's step 2,000 has seen at batch 256 (docs/experiments.md).
#   torchrun --nproc_per_node=8 train.py config/gradcache_stage1.py && ... config/gradcache_stage2.py
out_dir = "out/gradcache_stage1"
batch_size = 1024
grad_cache_chunk = 8
temperature = 0.02
max_iters = 1953
checkpoint_interval = 250
keep_checkpoints = [500]
