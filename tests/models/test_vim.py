"""Vim presets through timm: parameter counts, both scan directions, the middle class token,
position resizing, official checkpoint conversion (from a key/shape manifest of the release),
the dense-prediction adapter, precision."""
import math

import pytest
import timm
import torch
import torch.nn.functional as F

import ppma  # noqa: F401  (registers the presets)
from ppma.layers.embed import resample_pos_embed
from ppma.layers.vim import BiMamba
from ppma.models.family import create_from_checkpoint, family_of
from ppma.models.vim import Vim, checkpoint_filter_fn, checkpoint_model_kwargs
from ppma.ops.selective_scan_impl.reference import selective_scan_reference

# A micro plain config (test_vim's): width 16, 4 blocks, d_state 4, patch 8, 4x4 patches at 32.
MICRO = dict(embed_dim=16, depth=4, d_state=4, num_classes=7)


def seed_msg(m):
    return f"{m} (seed {torch.initial_seed()})"


def official_state_dict(embed_dim, depth, d_state, num_classes, grid=4, patch_size=8, expand=2, d_conv=4):
    """Names and shapes of the official Vim classification state dict (github.com/hustvl/Vim,
    ``vim/models_mamba.py`` with bimamba v2 and a middle class token), random values: the
    position embedding is ``(1, grid*grid + 1, dim)``, its class token entry at ``grid*grid // 2``."""
    d_inner, dt_rank = expand * embed_dim, math.ceil(embed_dim / 16)
    shapes = {
        "cls_token": (1, 1, embed_dim), "pos_embed": (1, grid * grid + 1, embed_dim),
        "patch_embed.proj.weight": (embed_dim, 3, patch_size, patch_size), "patch_embed.proj.bias": (embed_dim,),
        "norm_f.weight": (embed_dim,), "head.weight": (num_classes, embed_dim), "head.bias": (num_classes,),
    }
    for i in range(depth):
        m = f"layers.{i}.mixer"
        shapes[f"layers.{i}.norm.weight"] = (embed_dim,)
        shapes[f"{m}.in_proj.weight"] = (2 * d_inner, embed_dim)
        shapes[f"{m}.out_proj.weight"] = (embed_dim, d_inner)
        for s in ("", "_b"):
            shapes[f"{m}.conv1d{s}.weight"], shapes[f"{m}.conv1d{s}.bias"] = (d_inner, 1, d_conv), (d_inner,)
            shapes[f"{m}.x_proj{s}.weight"] = (dt_rank + 2 * d_state, d_inner)
            shapes[f"{m}.dt_proj{s}.weight"], shapes[f"{m}.dt_proj{s}.bias"] = (d_inner, dt_rank), (d_inner,)
            shapes[f"{m}.D{s}"] = (d_inner,)
        shapes[f"{m}.A_log"] = shapes[f"{m}.A_b_log"] = (d_inner, d_state)
    return {k: torch.randn(v) * 0.1 for k, v in shapes.items()}


def n_params(model):
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name,expected", [
    ("vim_tiny", 7_148_008), ("vim_small", 25_796_584), ("vim_base", 97_598_440),
    ("vim_tiny_stride8", 7_250_344), ("vim_small_stride8", 26_001_256),
])
def test_parameter_counts_match_the_release(name, expected):
    with torch.device("meta"):
        model = timm.create_model(name)
    assert n_params(model) == expected
    assert model.stem.pos_embed.shape[1] == (730 if "stride8" in name else 197)


def test_hierarchical_presets_have_ppma_widths_and_depths():
    with torch.device("meta"):
        tiny, small = timm.create_model("vim_hier_tiny"), timm.create_model("vim_hier_small")
    assert tiny.embed_dims == small.embed_dims == (64, 128, 256, 512)
    assert [len(s.blocks) for s in tiny.stages] == [2, 2, 8, 2]
    assert [len(s.blocks) for s in small.stages] == [3, 4, 18, 4]
    assert (n_params(tiny), n_params(small)) == (11_015_048, 19_785_160)


def bimamba_reference(m: BiMamba, x):
    """Both directions written out one at a time with the sequential scan reference."""
    length = x.shape[1]
    u, z = F.linear(x, m.in_proj.weight).transpose(1, 2).chunk(2, dim=1)

    def direction(u, z, conv, x_proj, dt_proj, a_log, d):
        u = F.silu(conv(u)[..., :length])
        dt, b, c = x_proj(u.transpose(1, 2)).split([m.dt_rank, m.d_state, m.d_state], dim=-1)
        y, _ = selective_scan_reference(u, (dt @ dt_proj.weight.T).transpose(1, 2), -a_log.exp(), b.transpose(1, 2),
                                        c.transpose(1, 2), d, z, dt_proj.bias, delta_softplus=True)
        return y

    y_f = direction(u, z, m.conv1d, m.x_proj, m.dt_proj, m.A_log, m.D)
    y_b = direction(u.flip(-1), z.flip(-1), m.conv1d_b, m.x_proj_b, m.dt_proj_b, m.A_b_log, m.D_b).flip(-1)
    return F.linear(((y_f + y_b) / 2).transpose(1, 2), m.out_proj.weight)


def test_bimamba_equals_the_two_directions_of_the_reference():
    m = BiMamba(12, d_state=5).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
        x = torch.randn(2, 9, 12)
        torch.testing.assert_close(m(x), bimamba_reference(m, x), rtol=1e-5, atol=1e-6, msg=seed_msg)


def test_backward_direction_is_used():
    """Fails if the backward direction is dropped: the first output token must depend on the
    last input token, and swapping the directions' parameters must mirror the sequence."""
    m = BiMamba(8, d_state=4).eval()
    x = torch.randn(1, 7, 8)
    with torch.no_grad():
        y = m(x)
        x2 = x.clone()
        x2[:, -1] += 10.0  # a forward-only mixer is causal: its first output would not change at all
        assert (m(x2)[:, 0] - y[:, 0]).abs().max() > 1e-4 * y.abs().max(), seed_msg("the first token ignores the last")
        mirrored = BiMamba(8, d_state=4).eval()
        names = {"conv1d": "conv1d_b", "x_proj": "x_proj_b", "dt_proj": "dt_proj_b", "A_log": "A_b_log", "D": "D_b"}
        names.update({v: k for k, v in names.items()})
        own = m.state_dict()
        swap = {k: own[".".join([names.get(k.split(".")[0], k.split(".")[0]), *k.split(".")[1:]])] for k in own}
        mirrored.load_state_dict(swap)
        torch.testing.assert_close(mirrored(x.flip(1)), y.flip(1), rtol=1e-5, atol=1e-6, msg=seed_msg)


@pytest.mark.parametrize("shape", [(1, 3, 40, 56), (2, 3, 33, 47)])
def test_class_token_sits_in_the_middle(shape):
    model = timm.create_model("test_vim", **MICRO).eval()
    x = torch.randn(shape)
    h, w = (shape[2] - 8) // 8 + 1, (shape[3] - 8) // 8 + 1  # 5x7 (odd count) and 4x5 (even)
    with torch.no_grad():
        tokens = model.stem(x)
        pos = resample_pos_embed(model.stem.pos_embed, (h, w), (4, 4), 1, "middle")
        i = h * w // 2
        torch.testing.assert_close(tokens[:, i], (model.stem.cls_token + pos[:, i])[:, 0].expand(shape[0], -1))
        patches = model.stem.proj(x).flatten(2).transpose(1, 2)
        torch.testing.assert_close(model.stem.patch_tokens(tokens), patches + model.stem.patch_tokens(pos))
        feats = model.forward_features(x)
        stream = tokens
        for block in model.blocks:
            stream = block(stream)
        torch.testing.assert_close(feats[:, 0], model.norm(stream)[:, i], msg=seed_msg)  # class token first
        torch.testing.assert_close(model(x), model.head.fc(feats[:, 0]), msg=seed_msg)


def test_position_embedding_resampling_keeps_the_class_entry():
    pos = torch.randn(1, 1 + 4 * 4, 6)  # class entry at 8
    out = resample_pos_embed(pos, (3, 5), (4, 4), 1, "middle")
    assert out.shape == (1, 1 + 15, 6)
    torch.testing.assert_close(out[:, 7], pos[:, 8])
    patches = torch.cat([pos[:, :8], pos[:, 9:]], 1).reshape(1, 4, 4, 6).permute(0, 3, 1, 2)
    expected = F.interpolate(patches, size=(3, 5), mode="bicubic", antialias=True).flatten(2).transpose(1, 2)
    torch.testing.assert_close(torch.cat([out[:, :7], out[:, 8:]], 1), expected)
    assert resample_pos_embed(pos, (4, 4), (4, 4), 1, "middle") is pos


def test_official_layout_converts_and_loads_strictly():
    official = official_state_dict(**MICRO)
    assert checkpoint_model_kwargs({"model": official}) == {"num_classes": 7}
    assert family_of("test_vim").checkpoint_filter_fn is checkpoint_filter_fn
    model = create_from_checkpoint("test_vim", {"model": official, "epoch": 3}, **{k: v for k, v in MICRO.items()
                                                                                   if k != "num_classes"})
    sd = model.state_dict()
    for ours, theirs in [("stem.proj.weight", "patch_embed.proj.weight"), ("stem.cls_token", "cls_token"),
                         ("stem.pos_embed", "pos_embed"), ("blocks.2.mixer.A_b_log", "layers.2.mixer.A_b_log"),
                         ("blocks.3.mixer.conv1d_b.bias", "layers.3.mixer.conv1d_b.bias"),
                         ("blocks.1.norm.weight", "layers.1.norm.weight"), ("norm.weight", "norm_f.weight"),
                         ("head.fc.weight", "head.weight")]:
        assert torch.equal(sd[ours], official[theirs]), ours
    again = checkpoint_filter_fn(model.state_dict(), model)  # our own layout passes through
    assert again.keys() == sd.keys()


def test_official_checkpoint_loads_at_another_input_size():
    """#27 of the release (730 vs 197 positions): a 4x4 checkpoint into a model for 6x6 patches."""
    official = official_state_dict(**MICRO)
    model = timm.create_model("test_vim", img_size=48, **MICRO)
    model.load_state_dict(checkpoint_filter_fn(official, model), strict=True)
    torch.testing.assert_close(model.stem.pos_embed[:, 18], official["pos_embed"][:, 8])  # class entry, middle
    expected = resample_pos_embed(official["pos_embed"], (6, 6), (4, 4), 1, "middle")
    torch.testing.assert_close(model.stem.pos_embed, expected)
    with torch.no_grad():
        y = model(torch.randn(1, 3, 48, 40))
    assert torch.isfinite(y).all(), seed_msg("non-finite logits")


def test_features_model_drops_class_token_and_keeps_its_adapter():
    official = official_state_dict(**MICRO)
    kwargs = {k: v for k, v in MICRO.items() if k != "num_classes"}
    features = timm.create_model("test_vim", features_only=True, **kwargs)
    model = features.model
    assert model.stem.cls_token is None and model.head is None and model.pyramid is not None
    adapter = {k: v.clone() for k, v in model.state_dict().items() if k.startswith("pyramid.")}
    state = checkpoint_filter_fn(official, model)
    model.load_state_dict(state, strict=True)
    pos = official["pos_embed"]
    torch.testing.assert_close(model.stem.pos_embed, torch.cat([pos[:, :8], pos[:, 9:]], 1))
    for k, v in adapter.items():
        assert torch.equal(model.state_dict()[k], v), k
    assert checkpoint_model_kwargs(model.state_dict()) == {"with_head": False, "class_token": False,
                                                           "global_pool": "avg", "pyramid": True}


@pytest.mark.parametrize("edit,message", [
    (lambda sd: sd.pop("layers.1.mixer.x_proj_b.weight"), r"\['blocks\.1\.mixer\.x_proj_b\.weight'\]"),
    (lambda sd: sd.update({"layers.0.mixer.gamma": torch.zeros(16)}), r"\['layers\.0\.mixer\.gamma'\]"),
    (lambda sd: sd.update({"pos_embed": torch.zeros(1, 16, 16)}), "not a square grid"),
])
def test_mismatched_keys_raise_naming_them(edit, message):
    official = official_state_dict(**MICRO)
    edit(official)
    with pytest.raises(ValueError, match=message):
        checkpoint_filter_fn(official, timm.create_model("test_vim", **MICRO))


@pytest.mark.parametrize("kwargs,shape", [
    ({}, (1, 3, 50, 70)),
    (dict(patch_size=16, patch_stride=8), (2, 3, 41, 63)),  # a stride-8 model: grid 4x6
])  # test_vim_hier's sizes: test_family.py
def test_features_only_at_odd_sizes(kwargs, shape):
    model = timm.create_model("test_vim", features_only=True, **kwargs).eval()
    assert model.feature_info.reduction() == [4, 8, 16, 32]
    with torch.no_grad():
        feats = model(torch.randn(shape))
    stride = kwargs.get("patch_stride", 8)
    h, w = ((n - kwargs.get("patch_size", 8)) // stride + 1 for n in shape[2:])
    expected = [(h * stride // s, w * stride // s) if s <= stride else (h // (s // stride), w // (s // stride))
                for s in (4, 8, 16, 32)]
    assert [tuple(f.shape[-2:]) for f in feats] == expected
    assert all(f.shape[:2] == (shape[0], c) for f, c in zip(feats, model.feature_info.channels()))


def test_the_adapter_taps_the_last_block_of_each_quarter():
    with torch.device("meta"):
        model = timm.create_model("vim_tiny", features_only=True).model
    assert model.tap_units == [5, 11, 17, 23]
    assert model.feature_info[0]["reduction"] == 4 and model.min_input_size == 32


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_autocast_over_24_blocks_has_no_nan(dtype):
    model = Vim(embed_dim=8, depth=24, d_state=4, patch_size=8, img_size=32, num_classes=5).eval()
    x = torch.randn(1, 3, 24, 32) * 3  # 3x4 patches
    with torch.no_grad():
        ref = model(x)
        with torch.autocast("cpu", dtype=dtype):
            y = model(x)
    assert torch.isfinite(y).all(), seed_msg(f"NaN/inf under {dtype} autocast")
    rel = ((y.float() - ref).norm() / ref.norm()).item()
    assert rel < 0.05, seed_msg(f"{dtype} relative error {rel:.3g}")




def test_no_weight_decay_names_the_released_set():
    model = timm.create_model("test_vim")
    expected = {"stem.pos_embed", "stem.cls_token"} | {
        f"blocks.{i}.mixer.{p}" for i in range(4) for p in ("A_log", "A_b_log", "D", "D_b")}
    assert model.no_weight_decay() == expected


def test_bad_configs_raise():
    with pytest.raises(ValueError, match="patch strides 16 and 8"):
        timm.create_model("test_vim", patch_stride=4, features_only=True)
    with pytest.raises(ValueError, match="no MLP"):
        from ppma.layers.vim import VimBlock
        VimBlock(8, BiMamba(8), mlp_ratio=4.0)
    with pytest.raises(ValueError, match="too small"):
        timm.create_model("test_vim", features_only=True)(torch.randn(1, 3, 24, 64))
