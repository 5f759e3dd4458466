# The toy's Stage II: from the toy's Stage I step 100, LoRA merged, the whole language model, dot product.
#   python train.py config/shapes_stage2.py
# The toy's scale, as config/shapes_stage1.py; then Stage II's recipe.
out_dir = "out/shapes_stage2"
init_from = "out/shapes_stage1/step_000100"
train_data = ["data/shapes/train.jsonl",  # the five image families; the videos, the pages (shapes/media_tasks.py)
              "data/shapes/train_video.jsonl", "data/shapes/train_docs.jsonl"]
image_dir = "data/shapes/images"
batch_size = 32
num_hard_negatives = 3
max_iters = 150
max_pixels = 128 * 192  # an image (128 x 128) whole, and a page (128 x 192: shapes/media_tasks.py)
video_frames = 4  # the toy's videos are 4 frames of 128 x 128 (shapes/media_tasks.py): 32 tokens each
video_max_pixels = 4 * 128 * 128  # t * h * w: every frame at its own size (the tiny model's own budget is 16,384)
max_length = 512
dtype = "float32"
device = "cpu"
activation_checkpointing = False
num_workers = 1
checkpoint_interval = 50
keep_checkpoints = []
similarity = "dot"
temperature = 6.4  # the tiny model's norms are about sqrt(64) = 8: dot / 6.4 matches cos / 0.1 in scale (docs/toy.md)
lora_rank = 0
learning_rate = 5e-4  # full fine-tuning of the tiny model; 2e-4 gave 33.8 overall, 5e-4 37.2 (toy evaluation)
threads = 1  # one torch thread: 2 are ~15 % faster on an idle 2-core machine and 15-70x slower on a busy one (docs/toy.md)
