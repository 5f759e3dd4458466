# The toy's Stage I: a tiny Qwen3.5, pretrained briefly on the toy's training scenes, learns the shapes benchmark
# on 2 CPU cores in a few minutes.
#   python -m shapes.prepare && python train.py config/shapes_stage1.py
# PACE's Stage I recipe (LoRA, cosine, focal), scaled to the toy: fewer, bigger steps.
out_dir = "out/shapes_stage1"
init_from = "data/shapes/tiny-qwen3.5"  # python -m shapes.prepare: shapes/tiny_model.py, then shapes/pretrain.py
train_data = ["data/shapes/train.jsonl",  # the five image families; the videos, the pages (shapes/media_tasks.py)
              "data/shapes/train_video.jsonl", "data/shapes/train_docs.jsonl"]
image_dir = "data/shapes/images"
batch_size = 32
num_hard_negatives = 3
max_iters = 150
learning_rate = 3e-3  # the tiny model needs far larger steps than a 0.8B (5e-3 learned less, from a random start)
lora_rank = 16
lora_alpha = 32
max_pixels = 128 * 192  # an image (128 x 128) whole, and a page (128 x 192: shapes/media_tasks.py)
video_frames = 4  # the toy's videos are 4 frames of 128 x 128 (shapes/media_tasks.py): 32 tokens each
video_max_pixels = 4 * 128 * 128  # t * h * w: every frame at its own size (the tiny model's own budget is 16,384)
max_length = 512
dtype = "float32"
device = "cpu"
activation_checkpointing = False
num_workers = 1
checkpoint_interval = 50
keep_checkpoints = [100]  # Stage II starts here, before Stage I converges (as the paper's step 2,000)
threads = 1  # one torch thread: 2 are ~15 % faster on an idle 2-core machine and 15-70x slower on a busy one (docs/toy.md)
