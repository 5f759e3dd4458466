# The toy's UniME-V2 run, applied over the toy's Stage I (config/shapes_stage1.py, given first): the hybrid of
# config/unime_v2_hybrid.py (plain InfoNCE beside the KL to a judge's soft labels; the released loss's KL alone would
# train the toy towards its stand-in judge's noise), on rows mined by the toy's Stage I export and judged by the
# tiny model (a stand-in judge: its scores carry no meaning, they run the code path):
#   python -m tools.mine --init_from=out/shapes_stage1/export --train_data=data/shapes/train.jsonl \
#       --image_dir=data/shapes/images --judge_from=data/shapes/tiny-qwen3.5 --num_hard_negatives=3 --pool_size=10 --out=data/shapes/mined
#   python train.py config/shapes_stage1.py config/shapes_unime_v2.py
#   python eval.py config/shapes_eval.py --init_from=out/shapes_unime_v2/export --out=out/shapes_eval_unime_v2.json
out_dir = "out/shapes_unime_v2"
train_data = ["data/shapes/mined"]
keep_checkpoints = []
focal_gamma = 0.0
soft_labels = "judge"
