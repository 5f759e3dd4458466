# The toy's Stage III: the toy reranker's scores distilled into the toy's Stage II export (config/distill.py's recipe).
#   python train.py config/shapes_rerank.py
#   python -m tools.distill --rerank_from=out/shapes_rerank/export --train_data=data/shapes/train.jsonl \
#       --image_dir=data/shapes/images --num_hard_negatives=3 --out=out/shapes_distill_rows --threads=1
#   python train.py config/shapes_distill.py && python eval.py config/shapes_eval.py --init_from=out/shapes_distill/export
import os
exec(open(os.path.join(os.path.dirname(__file__), "shapes_stage2.py")).read())  # the toy's data, budgets, run
out_dir = "out/shapes_distill"
init_from = "out/shapes_stage2/export"
train_data = ["out/shapes_distill_rows"]  # the image rows, scored (tools/distill.py writes no videos)
soft_labels = "judge"
judge_temperature = 1.0  # tau_t over the reranker's log-odds
alignment_weight = 1.0
infonce_weight = 1.0
max_iters = 50
keep_checkpoints = []
