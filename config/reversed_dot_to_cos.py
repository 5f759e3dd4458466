# Reversed similarity schedule (paper: cos->dot beats dot->cos by 2.9). Stage I with dot logits:
#   torchrun ... train.py config/reversed_dot_to_cos.py
# then Stage II with cosine from its step 2,000:
#   torchrun ... train.py config/stage2.py --init_from=out/reversed_dot_stage1/step_002000 \
#       --similarity=cos --temperature=0.1 --out_dir=out/reversed_cos_stage2
import os
exec(open(os.path.join(os.path.dirname(__file__), "stage1.py")).read())
out_dir = "out/reversed_dot_stage1"
similarity = "dot"
temperature = 100.0
