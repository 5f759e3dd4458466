# A multimodal reranker on the embedder's backbone (Qwen3-VL-Reranker's form, rerank.py): one prompt holds the query
# and a candidate, the score is log P(yes) - log P(no) of the next token (eq. R1), and LoRA on the language model
# learns it by a softmax cross-entropy over each query's positive and hard negatives (eq. R2, loss.py). The same
# rows, readers, mixtures, FSDP2 and bf16 as Stage I; docs/rerank.md gives the whole recipe.
#   torchrun --nproc_per_node=8 train.py config/rerank.py
out_dir = "out/rerank"
init_from = "models/Qwen3.5-0.8B-Base"  # a release (its LM head gives yes and no); its Instruct sibling also works
objective = "rerank"
system_prompt = ('Judge whether the Document meets the requirements of the Query. '
                 'Note that the answer can only be "yes" or "no".')  # Qwen3-Reranker's
num_hard_negatives = 7  # 1 + 7 = 8 prompts a query, each holding both sides
batch_size = 64  # queries a step: 512 prompts over 8 GPUs
temperature = 1.0  # tau_r of eq. (R2): the scores are log-odds already
learning_rate = 1e-4  # LoRA, as Stage I's adapters
lora_rank = 32
lora_alpha = 64
max_iters = 4000
max_length = 4096  # each side's budget: a pair takes up to twice it
micro_batch = 16  # prompts a forward call
keep_checkpoints = []
