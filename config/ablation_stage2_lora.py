# "PACE w/ S2 LoRA" (paper Table 2): Stage II trains fresh rank-32 LoRA adapters on the merged model instead of
# the full language model; dot-product logits at tau 100 and focal as in PACE. The paper gives no learning
# rate: 2e-5, the LoRA rate of Stage I (at Stage II's 2e-6 fresh adapters would hardly move; docs/experiments.md).
#   torchrun --nproc_per_node=8 train.py config/ablation_stage2_lora.py       # after config/stage1.py
out_dir = "out/ablation_stage2_lora"
init_from = "out/stage1/step_002000"
similarity = "dot"
temperature = 100.0
keep_checkpoints = []
