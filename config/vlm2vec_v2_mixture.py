# PACE's Stage I on VLM2Vec-V2's whole training mixture (its experiments/public/train/train_alltasks.yaml): the 20
# MMEB-train image subsets of config/vlm2vec_v2_image.py, ViDoRe's ColPali training set and VisRAG's in-domain pages
# (visual documents), and LLaVA-Hound's captioned and questioned videos, 8 frames each, each source with its weight
# (its share of the draws: weight / 52) and row cap, in same-source groups of 16 queries a GPU. The downloads and
# where each lands: docs/data.md. Check it first:
#   python train.py config/vlm2vec_v2_mixture.py --check_data=True
#   torchrun --nproc_per_node=8 train.py config/vlm2vec_v2_mixture.py
import os
exec(open(os.path.join(os.path.dirname(__file__), "vlm2vec_v2_image.py")).read())  # its 20 sources, homogeneous_batch,
# num_hard_negatives 0
out_dir = "out/vlm2vec_v2_mixture"
_V2 = "data/vlm2vec_train"  # as VLM2Vec-V2's download_data.sh lays it out (docs/data.md)
_FRAMES = f"{_V2}/video/train_300k"  # ShareGPTVideo's frames: a folder of frames a video, as the rows name them
_SFT = f"{_V2}/video/video_instruction/train/sft"
train_data = train_data + [
    {"path": f"{_V2}/colpali_train_set", "parser": "vidore", "weight": 10},  # vidore/colpali_train_set
    {"path": f"{_V2}/VisRAG-Ret-Train-In-domain-data", "parser": "visrag", "weight": 12},
    {"path": f"{_SFT}/video_caption_300k.jsonl", "parser": "llavahound_caption", "data_mode": "caption_retrieval",
     "image_dir": _FRAMES, "weight": 5},  # the yaml's num_rows 300_000: VLM2Vec-V2 reads it whole, as here
    {"path": f"{_SFT}/video_caption_300k.jsonl", "parser": "llavahound_caption", "data_mode": "video_retrieval",
     "image_dir": _FRAMES, "weight": 5},
    {"path": f"{_SFT}/video_240k_caption_15k.jsonl", "parser": "llavahound_qa", "image_dir": _FRAMES, "weight": 5,
     "max_rows": 240_000},  # download_data.sh's video_qa_240k.jsonl: its first 240,000 rows
]
video_frames = 8  # the yaml's num_frames: spread evenly over a video's frames, all of them when it has fewer
max_iters = 8500  # about an epoch of the image caps' 1.10M rows, ~240k pages and 840k video rows at batch 256
keep_checkpoints = [2000, 8500]
