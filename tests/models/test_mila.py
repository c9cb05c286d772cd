"""MILA presets through timm: parameter counts, any-size features, the 2-D RoPE, official
checkpoint conversion (from a key/shape manifest of the release), errors, precision; the layers'
rearranged arithmetic against the release's, written plainly here (values and gradients)."""
import pytest
import timm
import torch
import torch.nn.functional as F

import ppma  # noqa: F401
from ppma.layers.mila import (
    MILAAttention,
    MILABlock,
    MILADownsample,
    MILARotaryEmbedding,
    MILAStem,
    elu_plus_one,
    rope_phases,
    rope_tables,
)
from ppma.models.family import create_from_checkpoint, family_of
from ppma.models.mila import checkpoint_filter_fn, checkpoint_model_kwargs

# A micro config in the release's parametrisation (embed_dim doubles per stage).
MICRO = dict(embed_dim=16, depths=(1, 2, 1, 1), num_heads=(1, 2, 4, 8), mlp_ratio=4.0, num_classes=7)


def micro_kwargs(embed_dim, depths, num_heads, mlp_ratio, num_classes):
    return dict(embed_dims=tuple(embed_dim * 2**i for i in range(len(depths))), depths=depths, num_heads=num_heads,
                mlp_ratio=mlp_ratio, num_classes=num_classes)


def official_rotations(h, w, c, base=10000.0):
    """The release's fixed RoPE buffer, written from its definition: ``k = c // 4`` frequencies
    ``theta_m = 1 / base ** (m / k)``; angles ``[i * theta, j * theta]`` (rows first, then columns)
    for the token at row ``i``, column ``j``; buffer ``(H, W, c/2, 2)`` = ``(cos, sin)``."""
    k = c // 4
    theta = 1 / (base ** (torch.arange(k) / k))
    ii, jj = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    angles = torch.cat([ii[..., None] * theta, jj[..., None] * theta], dim=-1)
    return torch.stack([angles.cos(), angles.sin()], dim=-1)


def official_state_dict(embed_dim, depths, num_heads, mlp_ratio, num_classes, img_size=224, backbone=False):
    """Names and shapes of the official MLLA state dict (github.com/LeapLabTHU/MLLA,
    ``models/mlla.py``), random values; the RoPE buffers are the release's for ``img_size``.

    ``backbone=True``: the released detection/segmentation backbone (``downstream/*/backbones/
    mlla.py``): output LayerNorms ``norm{i}`` instead of the classifier ``norm`` / ``head``."""
    shapes = {}

    def conv(name, cout, cin_per_group, k, bias=True):
        shapes[f"{name}.weight"] = (cout, cin_per_group, k, k)
        if bias:
            shapes[f"{name}.bias"] = (cout,)

    def bn(name, c):
        for leaf in ("weight", "bias", "running_mean", "running_var"):
            shapes[f"{name}.{leaf}"] = (c,)
        shapes[f"{name}.num_batches_tracked"] = ()

    def linear(name, cout, cin):
        shapes[f"{name}.weight"], shapes[f"{name}.bias"] = (cout, cin), (cout,)

    d, half = embed_dim, embed_dim // 2
    stem = [("conv1", half, 3, 3), ("conv2.0", half, half, 3), ("conv2.1", half, half, 3),
            ("conv3.0", 4 * d, half, 3), ("conv3.1", d, 4 * d, 1)]
    for name, cout, cin, k in stem:  # ConvLayer: conv (no bias) + BatchNorm
        conv(f"patch_embed.{name}.conv", cout, cin, k, bias=False)
        bn(f"patch_embed.{name}.norm", cout)
    res = img_size // 4
    for i, depth in enumerate(depths):
        dim, r = d * 2**i, res // 2**i
        for j in range(depth):
            b = f"layers.{i}.blocks.{j}"
            for dw in ("cpe1", "dwc", "attn.lepe", "cpe2"):
                conv(f"{b}.{dw}", dim, 1, 3)
            for ln in ("norm1", "norm2"):
                shapes[f"{b}.{ln}.weight"] = shapes[f"{b}.{ln}.bias"] = (dim,)
            for p in ("in_proj", "act_proj", "out_proj"):
                linear(f"{b}.{p}", dim, dim)
            linear(f"{b}.attn.qk", 2 * dim, dim)
            shapes[f"{b}.attn.rope.rotations"] = (r, r, dim // 2, 2)
            linear(f"{b}.mlp.fc1", int(dim * mlp_ratio), dim)
            linear(f"{b}.mlp.fc2", dim, int(dim * mlp_ratio))
        if i + 1 < len(depths):  # PatchMerging: 1x1 (+ReLU), 3x3 s2 depthwise (+ReLU), 1x1 + BN
            out, hidden = 2 * dim, 8 * dim
            conv(f"layers.{i}.downsample.conv.0.conv", hidden, dim, 1)
            conv(f"layers.{i}.downsample.conv.1.conv", hidden, 1, 3)
            conv(f"layers.{i}.downsample.conv.2.conv", out, hidden, 1)
            bn(f"layers.{i}.downsample.conv.2.norm", out)
    if backbone:
        for i in range(len(depths)):
            shapes[f"norm{i}.weight"] = shapes[f"norm{i}.bias"] = (d * 2**i,)
    else:
        dim = d * 2 ** (len(depths) - 1)
        shapes["norm.weight"] = shapes["norm.bias"] = (dim,)
        linear("head", num_classes, dim)
    state = {}
    for name, shape in shapes.items():
        if name.endswith("num_batches_tracked"):
            state[name] = torch.tensor(3)
        elif name.endswith("rope.rotations"):
            state[name] = official_rotations(*shape[:2], 2 * shape[2])
        elif name.endswith("running_var"):
            state[name] = torch.rand(shape) + 0.5
        else:
            state[name] = torch.randn(shape) * 0.1
    return state


def n_params(model):
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name,expected", [
    ("mila_tiny", 24_392_200), ("mila_small", 43_015_048), ("mila_base", 95_983_960),
])
def test_parameter_counts_match_the_release(name, expected):
    with torch.device("meta"):
        model = timm.create_model(name)
    assert n_params(model) == expected
    assert not list(model.buffers()) or all("running" in n or "num_batches" in n for n, _ in model.named_buffers())


def test_flops_at_224_within_5_percent_of_the_paper():
    """MILA-T: the paper reports 4.2 G at 224 (multiply-add = 1); ours, 4.15 G when measured, also
    counts the out-of-place elementwise ops (the counter's trace runs without autograd, where the
    layers do gates, residuals and activations in place, and counts no in-place op)."""
    from ppma.models.flops import count_flops

    flops = count_flops(timm.create_model("mila_tiny"), (1, 3, 224, 224))
    assert abs(flops / 4.2e9 - 1) < 0.05, f"{flops / 1e9:.3f} G"


def test_presets_are_registered_with_pretrained_cfgs():
    assert {"mila_tiny", "mila_small", "mila_base", "test_mila"} <= set(timm.list_models("*mila*"))
    cfg = timm.get_pretrained_cfg("mila_tiny.in1k")
    assert cfg.classifier == "head.fc" and cfg.num_classes == 1000 and cfg.first_conv == "stem.conv1.conv"






def test_no_weight_decay_is_empty():
    assert timm.create_model("test_mila").no_weight_decay() == set()


def test_rope_at_224_equals_the_official_buffer():
    for stage, c in enumerate((64, 128, 256, 512)):
        r = 56 // 2**stage
        ours = MILARotaryEmbedding(c).rotations((r, r))
        torch.testing.assert_close(ours, official_rotations(r, r, c), rtol=1e-6, atol=1e-6)
    # and it is applied as the complex product (x[2p] + i x[2p+1]) * (cos + i sin), on channels-first grids
    x = torch.randn(2, 5, 7, 16)
    expected = release_rope(x, official_rotations(5, 7, 16))
    torch.testing.assert_close(MILARotaryEmbedding(16)(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1), expected,
                               msg=lambda m: f"{m} (seed {torch.initial_seed()})")


def test_official_layout_converts_and_loads_strictly():
    official = official_state_dict(**MICRO)
    assert checkpoint_model_kwargs({"model": official}) == {"num_classes": 7}
    model = timm.create_model("test_mila", **micro_kwargs(**MICRO)).eval()
    converted = checkpoint_filter_fn({"model": official}, model)
    model.load_state_dict(converted, strict=True)
    sd = model.state_dict()
    for ours, theirs in [("stem.conv3.1.conv.weight", "patch_embed.conv3.1.conv.weight"),
                         ("stages.1.downsample.conv.2.norm.running_var", "layers.0.downsample.conv.2.norm.running_var"),
                         ("stages.1.blocks.1.attn.qk.weight", "layers.1.blocks.1.attn.qk.weight"),
                         ("head.norm.weight", "norm.weight"), ("head.fc.bias", "head.bias")]:
        assert torch.equal(sd[ours], official[theirs]), ours
    with torch.no_grad():
        y = model(torch.randn(1, 3, 224, 224))
    assert y.shape == (1, 7) and torch.isfinite(y).all(), f"seed {torch.initial_seed()}"
    # our own layout passes through unchanged
    again = checkpoint_filter_fn(model.state_dict(), model)
    assert again.keys() == model.state_dict().keys()


def test_family_lookup_and_features_model_drop_the_head():
    official = official_state_dict(**MICRO)
    record = family_of("test_mila")
    assert record.checkpoint_filter_fn is checkpoint_filter_fn and record.checkpoint_model_kwargs is checkpoint_model_kwargs
    model = create_from_checkpoint("test_mila", official, **{k: v for k, v in micro_kwargs(**MICRO).items()
                                                              if k != "num_classes"})
    assert model.num_classes == 7
    backbone = timm.create_model("test_mila", with_head=False, **micro_kwargs(**MICRO))
    backbone.load_state_dict(checkpoint_filter_fn(official, backbone), strict=True)
    no_head = {k: v for k, v in official.items() if not k.startswith(("norm.", "head."))}
    assert checkpoint_model_kwargs(no_head) == {"with_head": False}


def test_official_detection_backbone_loads_into_a_features_model():
    official = official_state_dict(**MICRO, backbone=True)
    assert checkpoint_model_kwargs(official) == {"output_norms": [0, 1, 2, 3], "with_head": False}
    kwargs = {k: v for k, v in micro_kwargs(**MICRO).items() if k != "num_classes"}
    model = create_from_checkpoint("test_mila", official, **kwargs)
    torch.testing.assert_close(model.out_norms["2"].weight, official["norm2.weight"])
    features = timm.create_model("test_mila", features_only=True, **kwargs)
    features.model.load_state_dict(checkpoint_filter_fn(official, features.model), strict=True)
    with torch.no_grad():
        assert [f.shape[-2:] for f in features(torch.randn(1, 3, 100, 70))] == [(25, 18), (13, 9), (7, 5), (4, 3)]


def test_rope_buffer_mismatch_names_the_key():
    official = official_state_dict(**MICRO)
    model = timm.create_model("test_mila", **micro_kwargs(**MICRO))
    key = "layers.2.blocks.0.attn.rope.rotations"
    bad = dict(official)
    bad[key] = official_rotations(14, 14, 64, base=100.0)
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        checkpoint_filter_fn(bad, model)
    bad[key] = official_rotations(14, 14, 32)  # the wrong width for stage 2
    with pytest.raises(ValueError, match=r"layers\.2\.blocks\.0\.attn\.rope\.rotations has shape"):
        checkpoint_filter_fn(bad, model)
    # another grid (a checkpoint trained at 256) is fine: it is checked for its own grid
    ok = dict(official)
    ok[key] = official_rotations(16, 16, 64)
    checkpoint_filter_fn(ok, model)


@pytest.mark.parametrize("edit,message", [
    (lambda sd: sd.pop("layers.1.blocks.1.dwc.weight"),
     r"missing from the checkpoint: \['stages\.1\.blocks\.1\.dwc\.weight'\]"),
    (lambda sd: sd.update({"layers.0.blocks.0.extra.weight": torch.zeros(1)}),
     r"without a counterpart in the model: \['layers\.0\.blocks\.0\.extra\.weight'\]"),
    (lambda sd: sd.update({"absolute_pos_embed": torch.zeros(1)}), r"\['absolute_pos_embed'\]"),
])
def test_mismatched_keys_raise_naming_them(edit, message):
    official = official_state_dict(**MICRO)
    edit(official)
    model = timm.create_model("test_mila", **micro_kwargs(**MICRO))
    with pytest.raises(ValueError, match=message):
        checkpoint_filter_fn(official, model)








def test_bad_configs_raise():
    with pytest.raises(ValueError, match="multiple of 4"):
        timm.create_model("test_mila", embed_dims=(18, 32, 48, 64))
    with pytest.raises(ValueError, match="num_heads"):
        timm.create_model("test_mila", num_heads=(1, 2, 3))


def test_timm_one_liner_loads_an_official_file(tmp_path):
    official = official_state_dict(**MICRO)
    torch.save({"model": official, "epoch": 3}, tmp_path / "mlla.pth")
    overlay = dict(file=str(tmp_path / "mlla.pth"))
    model = timm.create_model("test_mila", pretrained=True, pretrained_cfg_overlay=overlay, **micro_kwargs(**MICRO))
    sd = model.state_dict()
    assert torch.equal(sd["stages.3.blocks.0.attn.lepe.weight"], official["layers.3.blocks.0.attn.lepe.weight"])
    assert torch.equal(sd["stem.conv1.norm.running_var"], official["patch_embed.conv1.norm.running_var"])


def test_fx_trace_matches_eager_at_other_sizes():
    from torchvision.models.feature_extraction import create_feature_extractor  # plain torch.fx tracing

    model = timm.create_model("test_mila").eval()
    fx = create_feature_extractor(model, ["stages.1", "head.fc"])
    with torch.no_grad():
        for shape in ((1, 3, 70, 90), (2, 3, 90, 66)):  # the RoPE follows the grid of each input
            x = torch.randn(shape)
            assert torch.equal(fx(x)["head.fc"], model(x)), f"{shape} (seed {torch.initial_seed()})"


# --- the layers against the release's arithmetic ---------------------------------------------
def release_rope(x, rotations):
    """The release's ``RoPE.forward`` on channels-last ``x`` ``(..., H, W, C)``: fp32 complex product."""
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(torch.view_as_complex(rotations) * pairs).flatten(-2)


def release_dwconv(conv, x):
    return F.conv2d(x.permute(0, 3, 1, 2), conv.weight, conv.bias, padding=1, groups=x.shape[-1]).permute(0, 2, 3, 1)


def release_attention(attn, x):
    """The release's ``LinearAttention.forward`` on channels-last ``(B, H, W, C)``, any grid."""
    b, h, w, c = x.shape
    n, heads = h * w, attn.num_heads
    qk = attn.qk(x)
    q, k = F.elu(qk[..., :c]) + 1.0, F.elu(qk[..., c:]) + 1.0
    rotations = official_rotations(h, w, c)

    def split(t):
        return t.reshape(b, n, heads, -1).transpose(1, 2)

    q_rope, k_rope = split(release_rope(q, rotations)), split(release_rope(k, rotations))
    q, k, v = split(q), split(k), split(x)
    z = 1 / (q @ k.mean(dim=-2, keepdim=True).transpose(-2, -1) + 1e-6)
    kv = (k_rope.transpose(-2, -1) * n**-0.5) @ (v * n**-0.5)
    return (q_rope @ kv * z).transpose(1, 2).reshape(b, h, w, c) + release_dwconv(attn.lepe, x)


def release_block(block, x):
    """The release's ``MLLABlock.forward`` on channels-last tokens."""
    x = x + release_dwconv(block.cpe1, x)
    shortcut = x
    x = block.norm1(x)
    gate = F.silu(block.act_proj(x))
    x = F.silu(release_dwconv(block.dwc, block.in_proj(x)))
    x = shortcut + block.out_proj(release_attention(block.attn, x) * gate)
    x = x + release_dwconv(block.cpe2, x)
    return x + block.mlp.fc2(F.gelu(block.mlp.fc1(block.norm2(x))))


def release_conv_layer(unit, x):
    """The release's ``ConvLayer``: conv, then BatchNorm and ReLU where present."""
    x = unit.conv(x)
    x = unit.norm(x) if unit.norm is not None else x
    return F.relu(x) if unit.act is not None else x


def release_stem(stem, x):
    x = release_conv_layer(stem.conv1, x)
    x = x + release_conv_layer(stem.conv2[1], release_conv_layer(stem.conv2[0], x))
    return release_conv_layer(stem.conv3[1], release_conv_layer(stem.conv3[0], x)).permute(0, 2, 3, 1)


def release_downsample(down, x):
    x = x.permute(0, 3, 1, 2)
    for unit in down.conv:
        x = release_conv_layer(unit, x)
    return x.permute(0, 2, 3, 1)


def perturbed(module):
    """``module`` with every parameter and BatchNorm statistic moved off its initialisation."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn_like(p))
        for name, buf in module.named_buffers():
            if "running_mean" in name:
                buf.normal_()
            elif "running_var" in name:
                buf.uniform_(0.5, 2.0)
    return module


def max_rel_err(got, want):
    return ((got - want).abs().max() / want.abs().max()).item()


def check_against_release(module, release, x, tol=1e-5):
    """Values and gradients (input and every parameter) of ``module(x)`` against ``release(module, x)``
    with autograd, then values without autograd (where the layers overwrite their intermediates)."""
    x = x.clone().requires_grad_()
    weight = torch.randn_like(release(module, x))
    grads = []
    for forward in (module, lambda t: release(module, t)):
        module.zero_grad()
        x.grad = None
        out = forward(x)
        (out * weight).sum().backward()
        grads.append([out.detach(), x.grad.clone()] + [p.grad.clone() for p in module.parameters()])
    names = ["output", "input grad"] + [f"{n} grad" for n, _ in module.named_parameters()]
    for name, got, want in zip(names, *grads):
        assert max_rel_err(got, want) < tol, f"{name}: {max_rel_err(got, want):.2e} (seed {torch.initial_seed()})"
    with torch.inference_mode():
        err = max_rel_err(module(x.detach()), grads[1][0])
    assert err < tol, f"inference: {err:.2e} (seed {torch.initial_seed()})"


@pytest.mark.parametrize("shape,heads", [((1, 7, 9, 16), 2), ((2, 5, 3, 24), 3), ((3, 4, 4, 8), 1)])
def test_attention_matches_the_release(shape, heads):
    attn = perturbed(MILAAttention(shape[-1], heads))
    check_against_release(attn, release_attention, torch.rand(shape) * 2 - 0.5)


@pytest.mark.parametrize("shape,heads", [((1, 7, 9, 16), 2), ((2, 6, 5, 32), 4)])
def test_block_matches_the_release(shape, heads):
    block = perturbed(MILABlock(shape[-1], MILAAttention(shape[-1], heads)))
    check_against_release(block, release_block, torch.randn(shape))


@pytest.mark.parametrize("train", [False, True])
def test_stem_and_downsample_match_the_release(train):
    """Eval: BatchNorms folded into the convs, 1x1 convs as linear maps; train: batch statistics."""
    stem = perturbed(MILAStem(3, 16)).train(train)
    down = perturbed(MILADownsample(16, 32)).train(train)
    check_against_release(stem, release_stem, torch.randn(2, 3, 30, 22))
    check_against_release(down, release_downsample, torch.randn(1, 7, 9, 16))


def test_elu_plus_one_matches_elu():
    x = torch.cat([torch.randn(1000) * 5, torch.tensor([0.0, -0.0, 1e-8, -1e-8, -100.0, 100.0, 1e30])])
    want = F.elu(x) + 1
    torch.testing.assert_close(elu_plus_one(x.clone()), want, rtol=1e-6, atol=1e-7)  # in place
    x.requires_grad_()
    got = elu_plus_one(x)
    got.backward(torch.ones_like(x))
    grad = x.grad.clone()
    x.grad = None
    (F.elu(x) + 1).backward(torch.ones_like(x))
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad, x.grad, rtol=1e-6, atol=1e-7)


def test_rope_tables_are_cached_and_usable_by_autograd():
    with torch.inference_mode():
        cached = rope_tables(5, 7, 16, 10000.0, torch.device("cpu"))
    assert rope_tables(5, 7, 16, 10000.0, torch.device("cpu")) is cached and not cached.is_inference()
    with torch.inference_mode():
        phases = rope_phases(5, 7, 16, 10000.0, torch.device("cpu"))
    assert rope_phases(5, 7, 16, 10000.0, torch.device("cpu")) is phases and not phases.is_inference()
    torch.testing.assert_close(cached, official_rotations(5, 7, 16).flatten(0, 1).permute(2, 1, 0))
    x = torch.randn(1, 16, 5, 7, requires_grad=True)  # a training forward after an inference one
    MILARotaryEmbedding(16)(x).sum().backward()
    assert x.grad is not None
