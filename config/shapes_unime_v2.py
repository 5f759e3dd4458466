# The toy's UniME-V2 run: the toy's Stage I (config/shapes_stage1.py's recipe) with plain InfoNCE and a judge's
# soft labels, on rows mined by the toy's Stage I export and judged by the tiny model (a stand-in judge: its scores
# carry no meaning, they only run the code path):
#   python mine.py --init_from=out/shapes_stage1/export --train_data=data/shapes/train.jsonl \
#       --image_dir=data/shapes/images --judge_from=data/shapes/tiny-qwen3.5 --num_hard_negatives=3 --out=data/shapes/mined
#   python train.py config/shapes_unime_v2.py && python eval.py config/shapes_eval.py --init_from=out/shapes_unime_v2/export
out_dir = "out/shapes_unime_v2"
init_from = "data/shapes/tiny-qwen3.5"
train_data = ["data/shapes/mined"]
image_dir = "data/shapes/images"
batch_size = 32
num_hard_negatives = 3
max_iters = 150
learning_rate = 3e-3
lora_rank = 16
lora_alpha = 32
max_pixels = 128 * 128
max_length = 512
dtype = "float32"
device = "cpu"
activation_checkpointing = False
num_workers = 1
checkpoint_interval = 50
threads = 1
focal_gamma = 0.0
soft_labels = "judge"
