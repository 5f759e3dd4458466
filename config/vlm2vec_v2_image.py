# PACE's Stage I on VLM2Vec-V2's image mixture: the 20 MMEB-train subsets of its train_alltasks.yaml, each with its
# weight (its share of the draws: weight / 15) and its row cap (num_sample_per_subset: the first rows, as VLM2Vec-V2
# reads them), in same-source groups of 16 queries a GPU (VLM2Vec-V2's homogeneous batches: its 64 of a GPU's 128).
# On MMEB-train as downloaded (docs/data.md); check it first:
#   python train.py config/vlm2vec_v2_image.py --check_data=True
#   torchrun --nproc_per_node=8 train.py config/vlm2vec_v2_image.py
out_dir = "out/vlm2vec_v2_image"
image_dir = "data/MMEB-train"  # its rows name images/<Subset>/Train/...
_SUBSETS = {  # subset folder: (weight, num_sample_per_subset)
    "ImageNet_1K": (1, 100_000), "N24News": (1, 50_000), "HatefulMemes": (0.5, 10_000), "VOC2007": (0.5, 10_000),
    "SUN397": (0.5, 20_000), "OK-VQA": (0.5, 10_000), "A-OKVQA": (0.5, 20_000), "DocVQA": (1, 40_000),
    "InfographicsVQA": (0.5, 25_000), "ChartQA": (0.5, 28_000), "Visual7W": (1, 70_000), "VisDial": (1, 130_000),
    "CIRR": (0.5, 30_000), "VisualNews_t2i": (1, 100_000), "VisualNews_i2t": (1, 100_000), "MSCOCO_t2i": (1, 100_000),
    "MSCOCO_i2t": (1, 120_000), "NIGHTS": (0.5, 20_000), "WebQA": (0.5, 20_000), "MSCOCO": (1, 100_000)}
train_data = [{"path": f"data/MMEB-train/{name}", "weight": weight, "max_rows": rows}
              for name, (weight, rows) in _SUBSETS.items()]
homogeneous_batch = 16
num_hard_negatives = 0  # MMEB-train gives none for most subsets; the in-batch candidates are the negatives
max_iters = 4308  # one epoch of the caps' 1,103,000 rows at batch 256 (fewer where a subset holds fewer rows)
keep_checkpoints = [2000, 4308]
