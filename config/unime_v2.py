# The UniME-V2 baseline (paper Tables 1 and 4) with UniME-V2's released objective (its Embedding/src/loss.py): the
# symmetric KL between the judge's soft labels and the model's cosine distribution over each query's own positive and
# hard negatives, alone (no InfoNCE), both at temperature 0.02, each log taken as log(p + 1e-8) (loss.py, eq. U3').
# Stage I's other settings (LoRA, lr 2e-5, 5 hard negatives; UniME-V2 uses 8), as the paper compares them. Its rows
# are mined with an embedder and scored by an MLLM judge first (docs/hard_negatives.md):
#   python -m tools.mine --init_from=out/vlm2vec/export --train_data="['data/mmE5/mmE5-MMEB-hardneg', 'data/mmE5/mmE5-synthetic']" \
#       --image_dir=data/mmE5 --judge_from=/models/Qwen3.5-2B --out=data/mined/mmE5
#   torchrun --nproc_per_node=8 train.py config/unime_v2.py
# config/unime_v2_hybrid.py is this codebase's hybrid instead: InfoNCE at Stage I's tau beside the exact KL.
out_dir = "out/unime_v2"
train_data = ["data/mined/mmE5"]  # tools/mine.py's output: its image paths are relative to image_dir, data/mmE5
focal_gamma = 0.0
soft_labels = "judge"
temperature = 0.02  # tau of the model's distribution Q (U2), UniME-V2's
judge_temperature = 0.02  # tau_j of the judge's P (U1), UniME-V2's
infonce_weight = 0.0  # the alignment alone
alignment_weight = 1.0
alignment_floor = 1e-8  # UniME-V2's log(p + 1e-8)
