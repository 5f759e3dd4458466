# Ablation "w/o focal" (paper Table 2): both stages with plain InfoNCE (gamma 0). Stage I first:
#   torchrun --nproc_per_node=8 train.py config/stage1.py --focal_gamma=0.0 --out_dir=out/stage1_no_focal
# then this file, Stage II from its step 2,000:
#   torchrun --nproc_per_node=8 train.py config/ablation_no_focal.py
import os
exec(open(os.path.join(os.path.dirname(__file__), "stage2.py")).read())
out_dir = "out/ablation_no_focal"
init_from = "out/stage1_no_focal/step_002000"
focal_gamma = 0.0
