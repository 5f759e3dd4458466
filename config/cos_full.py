# Figure 2(c): cosine logits with full fine-tuning from the backbone, focal off (Appendix C.2), lr 2e-6.
# The figure's other runs: vlm2vec.py (cos + LoRA), dot_lora.py (dot + LoRA), direct_dot.py (dot + full).
out_dir = "out/cos_full"
lora_rank = 0
learning_rate = 2e-6
focal_gamma = 0.0
