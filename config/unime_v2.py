# The UniME-V2 baseline (paper Tables 1 and 4): Stage I's settings (LoRA, cosine at tau 0.1, lr 2e-5) with plain
# InfoNCE (gamma 0, as the VLM2Vec baseline) and UniME-V2's judge-aligned soft labels (loss.py, eqs. U1-U4). Its rows
# are mined with an embedder and scored by an MLLM judge first (docs/hard_negatives.md):
#   python -m tools.mine --init_from=out/vlm2vec/export --train_data="['data/mmE5/mmE5-MMEB-hardneg', 'data/mmE5/mmE5-synthetic']" \
#       --image_dir=data/mmE5 --judge_from=/models/Qwen3.5-2B --out=data/mined/mmE5
#   torchrun --nproc_per_node=8 train.py config/unime_v2.py
out_dir = "out/unime_v2"
train_data = ["data/mined/mmE5"]  # tools/mine.py's output: its image paths are relative to image_dir, data/mmE5
focal_gamma = 0.0
soft_labels = "judge"
