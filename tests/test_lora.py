"""
Tests for lora.py on a tiny random Qwen3.5 (3 Gated DeltaNet layers + 1 full-attention layer).

    python -m pytest -q tests/test_lora.py
"""
import pytest
import torch
import torch.nn as nn
from transformers import Qwen3_5Config, Qwen3_5Model

from lora import LoRALinear, inject_lora, merge_lora

LAYER_TYPES = ['linear_attention'] * 3 + ['full_attention']


def tiny_model(seed=0, dtype=torch.float32):
    text = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                linear_value_head_dim=16, layer_types=LAYER_TYPES,
                rope_parameters=dict(rope_type='default', rope_theta=10000.0, partial_rotary_factor=0.25,
                                     mrope_section=[2, 1, 1], mrope_interleaved=True))
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                  num_position_embeddings=64)
    config = Qwen3_5Config(text_config=text, vision_config=vision, image_token_id=290,
                           video_token_id=291, vision_start_token_id=292, vision_end_token_id=293)
    torch.manual_seed(seed)
    return Qwen3_5Model(config).to(dtype).eval()


def inputs():
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, 280, (2, 9), generator=generator)  # (B, T), text only
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, :3] = 0  # one left-padded row
    return dict(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)


def hidden(model):
    return model(**inputs()).last_hidden_state  # (B, T, D)


def randomise_adapters(model, seed=2):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LoRALinear):
                for p in (module.lora_A, module.lora_B):
                    p.copy_(0.1 * torch.randn(p.shape, generator=generator))


def expected_names():
    names = []
    for i, layer_type in enumerate(LAYER_TYPES):
        prefix = f'language_model.layers.{i}.'
        if layer_type == 'full_attention':
            names += [prefix + f'self_attn.{p}' for p in ('q_proj', 'k_proj', 'v_proj', 'o_proj')]
        else:
            names += [prefix + f'linear_attn.{p}'
                      for p in ('in_proj_qkv', 'in_proj_z', 'in_proj_b', 'in_proj_a', 'out_proj')]
        names += [prefix + f'mlp.{p}' for p in ('gate_proj', 'up_proj', 'down_proj')]
    return sorted(names)


def test_lora_linear_matches_formula_with_bias():
    base = nn.Linear(8, 6)
    weight = base.weight
    lora = LoRALinear(base, rank=2, alpha=6.0)
    assert lora.weight is weight and not weight.requires_grad  # taken over, not copied
    nn.init.normal_(lora.lora_B)
    x = torch.randn(3, 5, 8)
    expected = x @ weight.T + base.bias + 3.0 * (x @ lora.lora_A.T @ lora.lora_B.T)
    torch.testing.assert_close(lora(x), expected)


def test_inject_wraps_exactly_the_language_model_linears_and_starts_identical():
    model = tiny_model()
    reference = hidden(model)
    weights = {name: model.get_submodule(name).weight for name in expected_names()}
    names = inject_lora(model, rank=4, alpha=8)
    assert names == expected_names()
    wrapped = sorted(name for name, module in model.named_modules() if isinstance(module, LoRALinear))
    assert wrapped == names and not any('visual' in name for name in wrapped)
    assert all(model.get_submodule(name).weight is weights[name] for name in names)  # no copy
    assert torch.equal(hidden(model), reference)  # B = 0: the update is exactly zero


def test_only_adapters_train_and_vision_is_untouched():
    model = tiny_model()
    vision_before = {name: p.clone() for name, p in model.visual.state_dict().items()}
    inject_lora(model, rank=4, alpha=8)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable == {f'{name}.lora_{ab}' for name in expected_names() for ab in 'AB'}
    vision_after = model.visual.state_dict()
    assert vision_after.keys() == vision_before.keys()
    assert all(torch.equal(vision_after[name], vision_before[name]) for name in vision_before)
    assert not any(p.requires_grad for p in model.visual.parameters())


def test_state_dict_is_base_keys_plus_adapters():
    model = tiny_model()
    base = {name: p.clone() for name, p in model.state_dict().items()}
    names = inject_lora(model, rank=4, alpha=8)
    state = model.state_dict()
    adapters = {f'{name}.lora_{ab}' for name in names for ab in 'AB'}
    assert set(state) == set(base) | adapters
    assert all(torch.equal(state[name], base[name]) for name in base)
    assert state[f'{names[0]}.lora_A'].shape[0] == 4 and state[f'{names[0]}.lora_B'].shape[1] == 4


def test_gradient_reaches_adapters_only():
    model = tiny_model()
    names = inject_lora(model, rank=4, alpha=8)
    hidden(model).square().mean().backward()
    for name in names:
        module = model.get_submodule(name)
        assert module.lora_B.grad is not None and module.lora_B.grad.abs().sum() > 0
        assert module.lora_A.grad is not None  # zero at init, since B = 0
        assert module.weight.grad is None
    assert all(p.grad is None for name, p in model.named_parameters() if 'lora_' not in name)


def test_merge_matches_unmerged_and_restores_base_state_dict_keys():
    model = tiny_model()
    base_output = hidden(model)
    base_shapes = {name: tensor.shape for name, tensor in model.state_dict().items()}
    names = inject_lora(model, rank=4, alpha=8)
    randomise_adapters(model)
    unmerged = hidden(model)
    assert (unmerged - base_output).abs().max() > 1e-2  # the adapters do something
    assert merge_lora(model) == len(names)
    assert not any(isinstance(module, LoRALinear) for module in model.modules())
    assert all(type(model.get_submodule(name)) is nn.Linear for name in names)
    torch.testing.assert_close(hidden(model), unmerged, atol=1e-5, rtol=1e-5)
    assert {name: tensor.shape for name, tensor in model.state_dict().items()} == base_shapes
    # Merged weights are fresh Parameters (trainable); everything else stays frozen.
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable == {f'{name}.weight' for name in names}
    assert merge_lora(model) == 0


def test_merge_linear_with_bias():
    model = nn.Module()
    model.language_model = nn.Module()
    model.language_model.q_proj = nn.Linear(8, 6)
    inject_lora(model, rank=2, alpha=4)
    randomise_adapters(model)
    x = torch.randn(4, 8)
    unmerged = model.language_model.q_proj(x)
    merge_lora(model)
    assert model.language_model.q_proj.bias is not None
    torch.testing.assert_close(model.language_model.q_proj(x), unmerged, atol=1e-6, rtol=1e-6)


def test_nothing_under_visual_is_wrapped_even_with_target_names():
    model = nn.Module()
    model.visual = nn.Module()
    model.visual.language_model = nn.Module()  # contrived: a target under visual must still be skipped
    model.visual.language_model.q_proj = nn.Linear(4, 4)
    model.language_model = nn.Module()
    model.language_model.q_proj = nn.Linear(4, 4)
    assert inject_lora(model, rank=2, alpha=4) == ['language_model.q_proj']
    assert type(model.visual.language_model.q_proj) is nn.Linear


def test_merge_in_bfloat16_keeps_dtype_and_sums_in_float32():
    model = tiny_model(dtype=torch.bfloat16)
    names = inject_lora(model, rank=4, alpha=8)
    lora = model.get_submodule(names[0])
    assert lora.lora_A.dtype == lora.lora_B.dtype == torch.bfloat16  # adapters follow the base dtype
    randomise_adapters(model)
    delta = 2.0 * (lora.lora_B.detach().float() @ lora.lora_A.detach().float())
    expected = (lora.weight.detach().float() + delta).to(torch.bfloat16)
    merge_lora(model)
    merged = model.get_submodule(names[0]).weight
    assert merged.dtype == torch.bfloat16 and torch.equal(merged, expected)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())


def test_inject_refuses_bad_input():
    model = tiny_model()
    for rank in (0, -1, 2.0):
        with pytest.raises(ValueError, match='rank'):
            inject_lora(model, rank=rank, alpha=8)
    with pytest.raises(ValueError, match='no LoRA target'):
        inject_lora(nn.Sequential(nn.Linear(4, 4)), rank=4, alpha=8)
    inject_lora(model, rank=4, alpha=8)
    with pytest.raises(RuntimeError, match='already'):
        inject_lora(model, rank=4, alpha=8)


def test_merge_lora_state_dict_equals_module_merge():
    from lora import merge_lora_state_dict
    torch.manual_seed(0)
    layer = torch.nn.Sequential()
    layer.language_model = torch.nn.Module()
    layer.language_model.q_proj = torch.nn.Linear(8, 6)
    inject_lora(layer, rank=2, alpha=6)
    torch.nn.init.normal_(layer.language_model.q_proj.lora_B)
    merged_dict = merge_lora_state_dict(layer.state_dict(), alpha=6)  # rank 2 read from lora_A: scale 3
    merge_lora(layer)
    assert merged_dict.keys() == layer.state_dict().keys()
    for key, value in layer.state_dict().items():
        torch.testing.assert_close(merged_dict[key], value)


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_vl"])
def test_merged_tiny_embedder_saves_and_reloads_to_the_same_embeddings(tiny_checkpoints, tmp_path, family):
    from model import Embedder
    from runs.export import save_hf_folder
    embedder = Embedder.from_pretrained(tiny_checkpoints[family])
    wrapped = inject_lora(embedder.model, rank=4, alpha=8)
    torch.manual_seed(1)
    for module in embedder.modules():
        if isinstance(module, LoRALinear):
            nn.init.normal_(module.lora_B, std=0.2)
    items = [{"text": "a red circle", "image": None}, {"text": "two shapes on the left", "image": None}]
    adapted = embedder.encode(items)
    assert merge_lora(embedder) == len(wrapped) == {"qwen3_5": 31, "qwen3_vl": 28}[family]  # every linear layer
    torch.testing.assert_close(embedder.encode(items), adapted, atol=1e-5, rtol=0)
    save_hf_folder(embedder.state_dict(), embedder.spec, str(tmp_path / "merged"), {"step": 0})
    reloaded = Embedder.from_pretrained(str(tmp_path / "merged"))
    torch.testing.assert_close(reloaded.encode(items), adapted, atol=1e-5, rtol=0)
    base = Embedder.from_pretrained(tiny_checkpoints[family]).encode(items)
    assert (base - adapted).abs().max() > 1e-2  # the adapters changed the function that was saved
