# Figure 2(c): dot-product logits (tau 100) with LoRA from the backbone, focal off (Appendix C.2), lr 2e-5.
out_dir = "out/dot_lora"
similarity = "dot"
temperature = 100.0
focal_gamma = 0.0
