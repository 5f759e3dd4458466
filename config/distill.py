# Stage III: the reranker's scores distilled into the Stage II embedder (Qwen3-VL-Embedding's and Ovis-VL-Embedding's
# last stage; docs/rerank.md says what differs from each). tools/distill.py scores each row's positive and hard
# negatives with the reranker (config/rerank.py) offline; the listwise alignment of loss.py's eqs. (U1)-(U4) pulls
# the embedder's softmax over them to the teacher's, at the teacher's temperature, beside PACE's focal InfoNCE.
#   torchrun --nproc_per_node=8 -m tools.distill --rerank_from=out/rerank/export --train_data=... --out=data/distill_rows
#   torchrun --nproc_per_node=8 train.py config/distill.py
out_dir = "out/distill"
init_from = "out/stage2/export"  # Stage II's export (or one of its step folders); its spec is kept (dot, pooling)
train_data = ["data/distill_rows"]  # tools/distill.py's out: the rows with the reranker's scores
image_dir = "data/mmE5"  # as the rows were scored with
soft_labels = "judge"  # the scores as soft labels, eq. (U1)
judge_temperature = 1.0  # tau_t: the teacher's log-odds (R1) at 1, the reranker's own softmax (R2)
alignment_weight = 1.0  # lambda of eq. (U4)
infonce_weight = 1.0  # mu: PACE's focal InfoNCE stays beside it
similarity = "dot"  # Stage II's logits, eq. (2)
temperature = 100.0
num_hard_negatives = 5  # as tools/distill.py scored
lora_rank = 0  # the whole language model, as Stage II
learning_rate = 2e-6
max_iters = 1000
keep_checkpoints = []
