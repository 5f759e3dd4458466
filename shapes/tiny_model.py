"""
shapes/tiny_model.py: a tiny random Qwen3.5 (or Qwen3-VL) in the file layout of a real release, for the toy and
the tests.

    python -m shapes.prepare                          # writes data/shapes/tiny-qwen3.5 with the toy data
    from shapes.tiny_model import make_tiny_checkpoint
    make_tiny_checkpoint("/tmp/tiny-qwen3.5", seed=0)                       # final norm uniform: every norm 8
    make_tiny_checkpoint("/tmp/tiny-qwen3.5", seed=0, final_norm_std=0.15)  # norms vary with direction, as a release's
    make_tiny_checkpoint("/tmp/tiny-qwen3-vl", seed=0, family="qwen3_vl")  # the second backbone family

Four decoder layers (three Gated DeltaNet, one full attention, the ratio of the real 0.8B and 2B), a
two-block vision tower, width 64, and a byte-level BPE tokenizer of 1,024 tokens with Qwen's special tokens.
It loads through exactly the path a release does (model.Embedder.from_pretrained, plain transformers), so
every test exercises the real code. The weights are random, but chosen so a few minutes of training on a
CPU can learn the toy benchmark (see the comments in make_tiny_checkpoint); shapes/pretrain.py then pretrains
it briefly on the toy's training scenes (python -m shapes.prepare does both).

The final RMSNorm sets the embedding's norm. Qwen3.5's is zero-centred, e = sqrt(D) (1 + w) * x / |x| (up to its
eps), so |e| depends on the input only through its direction, and with w = 0 (transformers' init, and this
function's default) every embedding has norm sqrt(D) = 8. A trained model's weight is not uniform:
final_norm_std draws w from N(0, final_norm_std^2), so the norms vary across items before any contrastive
training. FINAL_NORM_STD is the toy's choice, 0.15: the relative spread std/mean of the final norm's gain of
Qwen2.5-0.5B-Instruct (its output_norm: mean 7.14, std 1.10, i.e. 0.155, from a third-party dump of its GGUF
file in github.com/veighnsche/llama-orch), the only trained Qwen-family figure known here; its outliers, from 0
to 2.3x the mean, are not modelled, and no such figure is known for Qwen3.5. The toy's
brief pretraining hardly moves w (from w = 0 its 297 steps leave a std of 0.012, and the embedding norms of
the evaluation items a coefficient of variation of 0.0009), so the spread is set here.
"""
import json
import os
import sys

import torch

import common

FINAL_NORM_STD = 0.15  # the toy's spread of the final norm's weight w (the gain is 1 + w); see above

TINY_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                       "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                       "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]


def _tiny_tokenizer(vocab_size=1024):
    """A byte-level BPE trained on a fixed English corpus: deterministic, Qwen's special tokens on top."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    words = ("system user assistant represent the user's input given image to answer following question retrieve an that best matches "
             "description find caption describes this matching described changes what is shape colour color "
             "of a in on at left right top bottom middle center small large big tiny circle square triangle "
             "star cross diamond red green blue yellow purple orange black white gray pink brown cyan how many "
             "objects there are picture photo showing with and one two three four five six which where near far "
             "above below next select box region object from query candidate answer yes no true false").split()
    corpus = [" ".join(words[i:i + 7]) for i in range(len(words))] * 4 + ["0 1 2 3 4 5 6 7 8 9 , . ? ! : ; - ( )"]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(TINY_SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tokenizer.train_from_iterator(corpus, trainer)
    tokenizer.add_special_tokens(TINY_SPECIAL_TOKENS)
    return tokenizer


NORM_OFFSET = {"qwen3_5": 1.0}  # a family's final RMSNorm gain is offset + w: Qwen3.5's zero-centred 1 + w, else w


def make_tiny_checkpoint(out_dir, seed=0, final_norm_std=0.0, consolidated=False, family="qwen3_5"):
    """Write a tiny random backbone of a family in model.FAMILIES (text and vision) with a byte-level BPE
    tokenizer into out_dir, in the file layout of its release: 'qwen3_5' (Qwen3.5-0.8B-Base: Gated DeltaNet and
    full-attention layers) or 'qwen3_vl' (Qwen3-VL: full attention, deepstack vision features). final_norm_std:
    the spread of the final RMSNorm's gain (0: uniform, every embedding's norm sqrt(D); the Qwen3.5 weights are then
    those of earlier versions, bit for bit). consolidated: the processor settings as transformers 5 saves them, one
    processor_config.json ({"image_processor": ..., "video_processor": ...}), in place of the release's
    preprocessor_config.json and video_preprocessor_config.json. -> out_dir"""
    import transformers
    from transformers import PreTrainedTokenizerFast

    from model import FAMILIES
    os.makedirs(out_dir, exist_ok=True)
    tokenizer = _tiny_tokenizer()
    token = tokenizer.token_to_id
    hidden = 64
    text = dict(vocab_size=tokenizer.get_vocab_size(), hidden_size=hidden, intermediate_size=128, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=8192)
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=hidden, patch_size=16,
                  spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64)
    if family == "qwen3_5":
        text.update(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
                    linear_conv_kernel_dim=4, layer_types=["linear_attention"] * 3 + ["full_attention"],
                    rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25,
                                         mrope_section=[2, 1, 1], mrope_interleaved=True),
                    tie_word_embeddings=True, eos_token_id=token("<|endoftext|>"))
        name = "Qwen3_5"
    elif family == "qwen3_vl":  # 16 rotary pairs a head, split over time, height and width as the release splits 64
        text.update(rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[6, 5, 5],
                                         mrope_interleaved=True))
        vision.update(deepstack_visual_indexes=[0])
        name = "Qwen3VL"
    else:
        raise ValueError(f"family must be one of {sorted(FAMILIES)}, got {family!r}")
    config = getattr(transformers, f"{name}Config")(
        text_config=text, vision_config=vision, image_token_id=token("<|image_pad|>"),
        video_token_id=token("<|video_pad|>"), vision_start_token_id=token("<|vision_start|>"),
        vision_end_token_id=token("<|vision_end|>"), tie_word_embeddings=True)
    config.architectures = [f"{name}ForConditionalGeneration"]
    torch.manual_seed(seed)
    model = getattr(transformers, f"{name}ForConditionalGeneration")(config)
    with torch.no_grad():
        # transformers' 0.02-std init leaves the residual stream to the token embedding, so every item
        # pooled at the same <|endoftext|> would look alike; unit-variance layers make context count.
        # The vision blocks keep the small init, so the residual stream still carries the patch pixels.
        for name, param in model.named_parameters():
            if param.dim() >= 2 and ".visual.blocks." not in name:
                fan_in = param[0].numel()
                param.normal_(0.0, 1.0 if "embed_tokens" in name else fan_in ** -0.5)
            elif name.endswith("linear_attn.A_log"):
                # Gated DeltaNet keeps exp(-A * softplus(a + dt_bias)) of its state per token. The stock
                # A, up to 16, forgets within a token, so images would reach the pooled token only through
                # the one full-attention layer; A in [0.005, 0.05] remembers tens of tokens, and two
                # pictures of different colours then give cos 0.95, not 0.999 (tests/test_model.py).
                param.copy_(torch.empty_like(param).uniform_(0.005, 0.05).log())
        if final_norm_std:  # drawn last, so the other weights do not depend on it; (D,): the gain is offset + w
            model.model.language_model.norm.weight.normal_(1.0 - NORM_OFFSET.get(family, 0.0), final_norm_std)
    model.save_pretrained(out_dir)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                            unk_token=None).save_pretrained(out_dir)
    # the class a Qwen3.5 release names; transformers maps it onto tokenizer.json
    _update_json(os.path.join(out_dir, "tokenizer_config.json"), tokenizer_class="Qwen2Tokenizer",
                 model_max_length=8192)
    image = dict(patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5, 0.5, 0.5],
                 image_std=[0.5, 0.5, 0.5], size={"shortest_edge": 32 * 32, "longest_edge": 128 * 128})
    _update_json(os.path.join(out_dir, "preprocessor_config.json"), image_processor_type="Qwen2VLImageProcessor", **image)
    _update_json(os.path.join(out_dir, "video_preprocessor_config.json"),
                 video_processor_type="Qwen3VLVideoProcessor", **image)
    if consolidated:
        parts = {}
        for key, name in (("image_processor", "preprocessor_config.json"), ("video_processor", "video_preprocessor_config.json")):
            with open(os.path.join(out_dir, name)) as f:
                parts[key] = json.load(f)
            os.remove(os.path.join(out_dir, name))
        _update_json(os.path.join(out_dir, "processor_config.json"), processor_class="Qwen3VLProcessor", **parts)
    return out_dir


def _update_json(path, **values):
    data = {}
    if os.path.exists(path):
        with open(path) as f:
            data = json.load(f)
    data.update(values)
    with open(path, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":  # a library: it says what it is and what runs it
    common.library_help(__doc__, sys.argv[1:])
