# The toy's reranker (rerank.py): the tiny Qwen3.5 of shapes.prepare learns to score (query, candidate) prompts on
# the toy's training rows, with LoRA, on 2 CPU cores in a few minutes.
#   python -m shapes.prepare && python train.py config/shapes_rerank.py
#   python eval.py config/shapes_eval.py --init_from=out/shapes_stage2/export --rerank_from=out/shapes_rerank/export
import os
exec(open(os.path.join(os.path.dirname(__file__), "shapes_stage1.py")).read())  # the toy's data, budgets, run
out_dir = "out/shapes_rerank"
objective = "rerank"
system_prompt = ('Judge whether the Document meets the requirements of the Query. '
                 'Note that the answer can only be "yes" or "no".')
temperature = 1.0  # tau_r of eq. (R2)
max_iters = 100
keep_checkpoints = []
