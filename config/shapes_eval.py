# Evaluate a toy run on the shapes benchmark's ten image datasets (Shapes-CLS ... Shapes-GRD-OOD), with geometry, and
# on its video and document tasks (Shapes-VID-RET, Shapes-VID-QA, Shapes-DOC-RET: in MMEB-V2's layouts, scored apart).
#   python -m shapes.prepare && python train.py config/shapes_stage1.py && python train.py config/shapes_stage2.py
#   python eval.py config/shapes_eval.py                                          # the Stage II export
#   python eval.py config/shapes_eval.py --init_from=out/shapes_stage1/step_000100 --out=out/step100.json
# similarity is left '' so each checkpoint is ranked the way it was trained: cos for Stage I, dot for Stage II.
init_from = "out/shapes_stage2/export"
mmeb_dir = "data/shapes/eval"
image_dir = "data/shapes/images"
v2_dir = "data/shapes/v2"  # the toy's own tasks in MMEB-V2's layouts (v2/own_tasks.json; shapes/media_tasks.py)
out = "out/shapes_eval.json"  # give another --out for another checkpoint; its picture: python -m tools.geometry OUT
batch_size = 32
max_pixels = 128 * 192  # as in training (config/shapes_stage1.py): images and pages whole
max_length = 512
geometry_samples = 1000  # the ten datasets' 100 queries each: every query
dtype = "float32"
device = "cpu"
num_workers = 1
threads = 1  # one torch thread: 2 are ~15 % faster on an idle 2-core machine and 15-70x slower on a busy one (docs/toy.md)
