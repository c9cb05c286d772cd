"""VMamba presets through timm: parameter counts, FLOPs, SS2D against a per-route reference,
any-size features, official checkpoint conversion (from a key/shape manifest of the release: both
key generations, both Linear2d weight shapes, detection backbones), errors, precision."""
import math

import pytest
import timm
import torch
import torch.nn.functional as F

import ppma  # noqa: F401
from ppma.layers.vmamba import SS2D
from ppma.models.family import create_from_checkpoint, family_of
from ppma.models.vmamba import PRESETS, checkpoint_filter_fn, checkpoint_model_kwargs
from ppma.ops.selective_scan_impl.reference import selective_scan_reference

# Micro configs in the release's parametrisation (dims double per stage): v2 and vanilla (v0).
MICRO = dict(dims=16, depths=(1, 2, 1, 1), ssm_ratio=2.0, num_classes=7)
MICRO_V0 = dict(MICRO, version="v0")


def micro_kwargs(dims, depths, ssm_ratio, num_classes, version="v2"):
    kwargs = dict(embed_dims=tuple(dims * 2**i for i in range(len(depths))), depths=depths, ssm_ratio=ssm_ratio,
                  mlp_ratio=4.0, num_classes=num_classes)
    if version == "v0":
        kwargs.update(d_state=16, conv_bias=True, forward_type="v0", mlp_ratio=0.0, patchembed_version="v1",
                      downsample_version="v1")
    return kwargs


def official_state_dict(dims, depths, ssm_ratio, num_classes, version="v2", backbone=False, old_names=False,
                        linear2d_4d=False, device=None):
    """Names and shapes of an official VMamba state dict (github.com/MzeroMiko/VMamba,
    ``classification/models/vmamba.py``, ``VSSM``), random values.

    ``version``: ``'v2'`` (``forward_type='v05_noz'``, ``d_state=1``, v2 patch embed, v3
    downsample, MLP 4x, channels-first ``Linear2d``) or ``'v0'`` (vanilla: gate, ``d_state=16``,
    conv bias, v1 patch embed, patch merging, no MLP). ``backbone=True``: the detection/segmentation
    backbone (``Backbone_VSSM``: ``outnorm{i}``, no classifier). ``old_names``: the previous key
    generation (``patch_embed.proj/norm``, ``ln_1``, ``self_attention``, ``norm``, ``head``), which
    the release renames on load. ``linear2d_4d``: ``Linear2d`` weights stored as ``(out, in, 1, 1)``.
    """
    shapes = {}
    v0 = version == "v0"
    d_state = 16 if v0 else 1

    def add(name, *shape):
        shapes[name] = shape

    def norm(name, c):
        add(f"{name}.weight", c)
        add(f"{name}.bias", c)

    def linear2d(name, cout, cin, bias):
        add(f"{name}.weight", *((cout, cin, 1, 1) if linear2d_4d and not v0 else (cout, cin)))
        if bias:
            add(f"{name}.bias", cout)

    d = dims
    if v0:
        add("patch_embed.0.weight", d, 3, 4, 4)
        add("patch_embed.0.bias", d)
        norm("patch_embed.2", d)
    else:
        add("patch_embed.0.weight", d // 2, 3, 3, 3)
        add("patch_embed.0.bias", d // 2)
        norm("patch_embed.2", d // 2)
        add("patch_embed.5.weight", d, d // 2, 3, 3)
        add("patch_embed.5.bias", d)
        norm("patch_embed.7", d)
    for i, depth in enumerate(depths):
        dim = d * 2**i
        inner, rank = int(ssm_ratio * dim), math.ceil(dim / 16)
        for j in range(depth):
            b = f"layers.{i}.blocks.{j}"
            norm(f"{b}.norm", dim)
            linear2d(f"{b}.op.in_proj", 2 * inner if v0 else inner, dim, bias=False)
            add(f"{b}.op.conv2d.weight", inner, 1, 3, 3)
            if v0:
                add(f"{b}.op.conv2d.bias", inner)
            add(f"{b}.op.x_proj_weight", 4, rank + 2 * d_state, inner)
            add(f"{b}.op.dt_projs_weight", 4, inner, rank)
            add(f"{b}.op.dt_projs_bias", 4, inner)
            add(f"{b}.op.A_logs", 4 * inner, d_state)
            add(f"{b}.op.Ds", 4 * inner)
            norm(f"{b}.op.out_norm", inner)
            linear2d(f"{b}.op.out_proj", dim, inner, bias=False)
            if not v0:
                norm(f"{b}.norm2", dim)
                linear2d(f"{b}.mlp.fc1", 4 * dim, dim, bias=True)
                linear2d(f"{b}.mlp.fc2", dim, 4 * dim, bias=True)
        if i + 1 < len(depths):
            if v0:  # PatchMerging2D
                norm(f"layers.{i}.downsample.norm", 4 * dim)
                add(f"layers.{i}.downsample.reduction.weight", 2 * dim, 4 * dim)
            else:  # (Identity, conv 3x3 s2, Identity, LayerNorm2d)
                add(f"layers.{i}.downsample.1.weight", 2 * dim, dim, 3, 3)
                add(f"layers.{i}.downsample.1.bias", 2 * dim)
                norm(f"layers.{i}.downsample.3", 2 * dim)
    if backbone:
        for i in range(len(depths)):
            norm(f"outnorm{i}", d * 2**i)
    else:
        dim = d * 2 ** (len(depths) - 1)
        norm("classifier.norm", dim)
        add("classifier.head.weight", num_classes, dim)
        add("classifier.head.bias", num_classes)
    if old_names:
        renames = (("patch_embed.0.", "patch_embed.proj."), ("patch_embed.2.", "patch_embed.norm."),
                   (".norm.", ".ln_1."), (".op.", ".self_attention."), ("classifier.", ""))
        renamed = {}
        for name, shape in shapes.items():
            for old, new in renames:
                if old == ".norm." and ".blocks." not in name:
                    continue
                name = name.replace(old, new, 1) if old.startswith(".") else (
                    new + name.removeprefix(old) if name.startswith(old) else name)
            renamed[name] = shape
        shapes = renamed
    if device == "meta":
        return {name: torch.empty(shape, device="meta") for name, shape in shapes.items()}
    return {name: torch.randn(shape) * 0.1 for name, shape in shapes.items()}


def n_params(model):
    return sum(p.numel() for p in model.parameters())


COUNTS = {
    "vmamba_tiny": 30_249_064, "vmamba_small": 49_012_840, "vmamba_base": 86_614_504,
    "vmamba_tiny_s2l5": 30_705_832, "vmamba_small_s2l15": 50_147_752, "vmamba_base_s2l15": 88_557_800,
    "vmamba_tiny_v0": 22_893_448, "vmamba_small_v0": 44_417_416, "vmamba_base_v0": 76_254_056,
}


@pytest.mark.parametrize("name", list(COUNTS))
def test_parameter_counts_match_the_release(name):
    with torch.device("meta"):
        model = timm.create_model(name)
    assert n_params(model) == COUNTS[name]
    assert not list(model.buffers())


def test_flops_at_224_within_5_percent_of_the_release():
    """VMamba-T (s1l8): 4.9 G in the release's table (multiply-add = 1, the selective scan at
    ``9 B L D N``); ours counts the same scan formula plus elementwise ops."""
    from ppma.models.flops import count_flops

    flops = count_flops(timm.create_model("vmamba_tiny"), (1, 3, 224, 224))
    assert abs(flops / 4.9e9 - 1) < 0.05, f"{flops / 1e9:.3f} G"


def test_presets_are_registered_with_pretrained_cfgs():
    names = set(timm.list_models("*vmamba*"))
    aliases = {"vmamba_tiny_s1l8", "vmamba_small_s1l20", "vmamba_base_s1l20"}
    assert set(COUNTS) | aliases | {"test_vmamba"} <= names
    cfg = timm.get_pretrained_cfg("vmamba_tiny.in1k")
    assert cfg.classifier == "head.fc" and cfg.num_classes == 1000 and cfg.first_conv == "stem.conv1"
    assert cfg.url == timm.get_pretrained_cfg("vmamba_tiny_s1l8.in1k").url
    assert timm.get_pretrained_cfg("vmamba_tiny_v0.in1k").first_conv == "stem.proj"
    with torch.device("meta"):  # the release's name builds the same model
        a, b = timm.create_model("vmamba_tiny_s1l8"), timm.create_model("vmamba_tiny")
    assert [(k, v.shape) for k, v in a.state_dict().items()] == [(k, v.shape) for k, v in b.state_dict().items()]
    assert a.stages[2].blocks[0].op.d_inner == PRESETS["vmamba_tiny"]["embed_dims"][2]  # ssm_ratio 1


def route_reference(op: SS2D, x: torch.Tensor) -> torch.Tensor:
    """SS2D from its definition: four separate Mamba scans, each with its own parameters, along
    row-major, column-major and the two reversed orders of the grid, put back and summed.
    Sequential fp32 scan; no cross_scan / cross_merge, no grouping."""
    b, h, w, _ = x.shape
    x = op.in_proj(x)
    if op.gate:
        x, z = x.chunk(2, dim=-1)
    u = F.silu(op.conv2d(x.permute(0, 3, 1, 2))).flatten(2)  # (B, D, L), row-major
    grid = torch.arange(h * w).view(h, w)
    orders = [grid.flatten(), grid.t().flatten()]
    orders += [o.flip(0) for o in orders]
    d, r, n = op.d_inner, op.dt_rank, op.d_state
    y = torch.zeros_like(u)
    for k, order in enumerate(orders):
        seq = u[:, :, order]
        dbl = torch.einsum("cd,bdl->bcl", op.x_proj_weight[k], seq)
        dt = torch.einsum("dr,brl->bdl", op.dt_projs_weight[k], dbl[:, :r])
        rows = slice(k * d, (k + 1) * d)
        yk, _ = selective_scan_reference(seq, dt, -op.A_logs[rows].exp(), dbl[:, r:r + n], dbl[:, r + n:],
                                         op.Ds[rows], delta_bias=op.dt_projs_bias[k], delta_softplus=True)
        y[:, :, order] += yk
    y = op.out_norm(y.transpose(1, 2).reshape(b, h, w, d))
    return op.out_proj(y * F.silu(z) if op.gate else y)


@pytest.mark.parametrize("forward_type,d_state,shape", [("v05_noz", 1, (1, 7, 9)), ("v05_noz", 3, (2, 5, 3)),
                                                        ("v0", 4, (1, 9, 7))])
def test_ss2d_equals_four_route_scans(forward_type, d_state, shape):
    op = SS2D(12, d_state=d_state, ssm_ratio=1.5, forward_type=forward_type, conv_bias=forward_type == "v0")
    with torch.no_grad():  # trained-like values: A, D and dt away from their initialisation
        for p in (op.A_logs, op.Ds, op.dt_projs_bias, op.out_norm.weight):
            p.add_(torch.randn_like(p) * 0.3)
    x = torch.randn(*shape, 12)
    with torch.no_grad():
        torch.testing.assert_close(op(x), route_reference(op, x), rtol=1e-5, atol=1e-5,
                                   msg=lambda m: f"{m} (seed {torch.initial_seed()})")




def test_vanilla_features_follow_the_release_sizes():
    """v1 patch embed: floor(H / 4) (a partial patch is dropped), then patch merging pads: ceil."""
    model = timm.create_model("test_vmamba", features_only=True, **micro_kwargs(**MICRO_V0)).eval()
    with torch.no_grad():
        feats = model(torch.randn(1, 3, 161, 227))
    assert [tuple(f.shape[-2:]) for f in feats] == [(40, 56), (20, 28), (10, 14), (5, 7)]




def test_no_weight_decay_names_the_released_set():
    model = timm.create_model("test_vmamba")
    assert model.no_weight_decay() == {f"stages.{s}.blocks.0.op.{p}" for s in range(4)
                                       for p in ("A_logs", "Ds", "dt_projs_bias")}


def test_initialisation_as_released():
    op = timm.create_model("test_vmamba").stages[1].blocks[0].op
    assert torch.equal(op.A_logs, torch.zeros(4 * 64, 1)) and torch.equal(op.Ds, torch.ones(4 * 64))
    dt = F.softplus(op.dt_projs_bias)
    assert dt.shape == (4, 64) and dt.min() >= 1e-4 - 1e-7 and dt.max() <= 0.1 + 1e-6
    assert op.dt_projs_weight.abs().max() <= op.dt_rank**-0.5
    v0 = SS2D(32, d_state=16, forward_type="v0")
    assert torch.allclose(-v0.A_logs.exp()[0], -torch.arange(1.0, 17.0))


@pytest.mark.parametrize("micro,old_names,linear2d_4d", [
    (MICRO, False, False), (MICRO, True, True), (MICRO, False, True), (MICRO_V0, False, False), (MICRO_V0, True, False),
])
def test_official_layout_converts_and_loads_strictly(micro, old_names, linear2d_4d):
    official = official_state_dict(**micro, old_names=old_names, linear2d_4d=linear2d_4d)
    assert checkpoint_model_kwargs({"model": official}) == {"num_classes": 7}
    model = timm.create_model("test_vmamba", **micro_kwargs(**micro)).eval()
    converted = checkpoint_filter_fn({"model": official, "model_ema": official}, model)
    model.load_state_dict(converted, strict=True)
    sd = model.state_dict()
    v0 = micro.get("version") == "v0"
    pairs = [("stages.1.blocks.1.op.x_proj_weight", "layers.1.blocks.1.op.x_proj_weight"),
             ("stages.2.blocks.0.op.A_logs", "layers.2.blocks.0.op.A_logs"),
             ("stages.0.blocks.0.norm.bias", "layers.0.blocks.0.norm.bias"),
             ("head.norm.weight", "classifier.norm.weight"), ("head.fc.bias", "classifier.head.bias")]
    if v0:
        pairs += [("stem.proj.weight", "patch_embed.0.weight"), ("stem.norm.bias", "patch_embed.2.bias"),
                  ("stages.3.downsample.reduction.weight", "layers.2.downsample.reduction.weight"),
                  ("stages.1.downsample.norm.weight", "layers.0.downsample.norm.weight")]
    else:
        pairs += [("stem.conv2.weight", "patch_embed.5.weight"), ("stem.norm2.bias", "patch_embed.7.bias"),
                  ("stages.3.downsample.conv.weight", "layers.2.downsample.1.weight"),
                  ("stages.1.downsample.norm.weight", "layers.0.downsample.3.weight"),
                  ("stages.2.blocks.0.mlp.fc1.weight", "layers.2.blocks.0.mlp.fc1.weight")]
    pairs.append(("stages.1.blocks.0.op.out_proj.weight", "layers.1.blocks.0.op.out_proj.weight"))
    if old_names:
        old = {"patch_embed.0.": "patch_embed.proj.", "patch_embed.2.": "patch_embed.norm.", ".op.": ".self_attention.",
               "blocks.0.norm.": "blocks.0.ln_1.", "classifier.": ""}
        for new, was in old.items():
            pairs = [(ours, theirs.replace(new, was)) for ours, theirs in pairs]
    for ours, theirs in pairs:
        assert torch.equal(sd[ours], official[theirs].reshape(sd[ours].shape)), ours
    with torch.no_grad():
        y = model(torch.randn(1, 3, 64, 96))
    assert y.shape == (1, 7) and torch.isfinite(y).all(), f"seed {torch.initial_seed()}"
    again = checkpoint_filter_fn(model.state_dict(), model)  # our own layout passes through unchanged
    assert again.keys() == model.state_dict().keys()


def test_family_lookup_and_features_model_drop_the_head():
    official = official_state_dict(**MICRO)
    record = family_of("test_vmamba")
    assert record.checkpoint_filter_fn is checkpoint_filter_fn and record.checkpoint_model_kwargs is checkpoint_model_kwargs
    kwargs = {k: v for k, v in micro_kwargs(**MICRO).items() if k != "num_classes"}
    assert create_from_checkpoint("test_vmamba", official, **kwargs).num_classes == 7
    backbone = timm.create_model("test_vmamba", with_head=False, **kwargs)
    backbone.load_state_dict(checkpoint_filter_fn(official, backbone), strict=True)
    no_head = {k: v for k, v in official.items() if not k.startswith("classifier.")}
    assert checkpoint_model_kwargs(no_head) == {"with_head": False}


def test_official_detection_backbone_loads_into_a_features_model():
    official = official_state_dict(**MICRO, backbone=True)
    detector = {"state_dict": {f"backbone.{k}": v for k, v in official.items()}, "meta": {}}
    assert checkpoint_model_kwargs(detector) == {"output_norms": [0, 1, 2, 3], "with_head": False}
    kwargs = {k: v for k, v in micro_kwargs(**MICRO).items() if k != "num_classes"}
    model = create_from_checkpoint("test_vmamba", detector, **kwargs)
    torch.testing.assert_close(model.out_norms["2"].weight, official["outnorm2.weight"])
    features = timm.create_model("test_vmamba", features_only=True, **kwargs)
    features.model.load_state_dict(checkpoint_filter_fn(detector, features.model), strict=True)
    with torch.no_grad():
        assert [f.shape[-2:] for f in features(torch.randn(1, 3, 100, 70))] == [(25, 18), (13, 9), (7, 5), (4, 3)]


def test_a_checkpoint_of_another_variant_names_the_mismatching_keys():
    """The s1l8 / s2l5 confusion: both are "VMamba-T"; on the meta device, so nothing is allocated."""
    s2l5 = official_state_dict(dims=96, depths=(2, 2, 5, 2), ssm_ratio=2.0, num_classes=1000, device="meta")
    with torch.device("meta"):
        s1l8 = timm.create_model("vmamba_tiny")
        real_s2l5 = timm.create_model("vmamba_tiny_s2l5")
    with pytest.raises(ValueError, match=r"missing from the checkpoint: \['stages\.2\.blocks\.5\.norm\.weight'"):
        checkpoint_filter_fn(s2l5, s1l8)
    assert checkpoint_filter_fn(s2l5, real_s2l5).keys() == real_s2l5.state_dict().keys()
    # same keys, other widths (ssm_ratio 2 into 1): the shapes are named
    same_depth = official_state_dict(dims=96, depths=(2, 2, 8, 2), ssm_ratio=2.0, num_classes=1000, device="meta")
    with pytest.raises(ValueError, match=r"shapes differ: \['size mismatch for stages\.0\.blocks\.0\.op\.in_proj\.weight "
                                         r"\(checkpoint key layers\.0\.blocks\.0\.op\.in_proj\.weight\): "
                                         r"\(192, 96\) in the checkpoint, \(96, 96\) in the model'.* and 132 more \(140 in all\)"):
        checkpoint_filter_fn(same_depth, s1l8)


@pytest.mark.parametrize("edit,message", [
    (lambda sd: sd.pop("layers.1.blocks.1.op.Ds"), r"missing from the checkpoint: \['stages\.1\.blocks\.1\.op\.Ds'\]"),
    (lambda sd: sd.update({"layers.0.blocks.0.op.x_proj_bias": torch.zeros(1)}),
     r"without a counterpart in the model: \['layers\.0\.blocks\.0\.op\.x_proj_bias'\]"),
    (lambda sd: sd.update({"pos_embed": torch.zeros(1)}), r"\['pos_embed'\]"),
])
def test_mismatched_keys_raise_naming_them(edit, message):
    official = official_state_dict(**MICRO)
    edit(official)
    model = timm.create_model("test_vmamba", **micro_kwargs(**MICRO))
    with pytest.raises(ValueError, match=message):
        checkpoint_filter_fn(official, model)






def test_autocast_bf16_forward_of_the_vanilla_version_has_no_nan():
    """v0 (gate, d_state 16) under autocast; test_family.py runs test_vmamba's v2."""
    model = timm.create_model("test_vmamba", **micro_kwargs(**MICRO_V0)).eval()
    x = torch.randn(1, 3, 32, 40)
    with torch.no_grad():
        ref = model(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = model(x)
    assert torch.isfinite(y).all(), f"NaN/inf under bf16 autocast (seed {torch.initial_seed()})"
    rel = ((y.float() - ref).norm() / ref.norm()).item()
    assert rel < 0.05, f"bf16 relative error {rel:.3g} (seed {torch.initial_seed()})"


def test_bad_configs_raise():
    with pytest.raises(ValueError, match="forward_type"):
        timm.create_model("test_vmamba", forward_type="v3")
    with pytest.raises(ValueError, match="patchembed_version"):
        timm.create_model("test_vmamba", patchembed_version="v3")
    with pytest.raises(ValueError, match="downsample_version"):
        timm.create_model("test_vmamba", downsample_version="v2")
    with pytest.raises(ValueError, match=r"\(B, H, W, 16\)"):
        SS2D(16)(torch.randn(1, 16, 8, 8))


def test_timm_one_liner_loads_an_official_file(tmp_path):
    official = official_state_dict(**MICRO)
    ema = {k: v + 1 for k, v in official.items()}
    torch.save({"model": official, "model_ema": ema, "epoch": 3}, tmp_path / "vssm.pth")
    overlay = dict(file=str(tmp_path / "vssm.pth"))
    model = timm.create_model("test_vmamba", pretrained=True, pretrained_cfg_overlay=overlay, **micro_kwargs(**MICRO))
    sd = model.state_dict()  # timm's loader takes the EMA weights when a checkpoint has them
    assert torch.equal(sd["stages.3.blocks.0.op.dt_projs_bias"], ema["layers.3.blocks.0.op.dt_projs_bias"])
    assert torch.equal(sd["stem.conv1.weight"], ema["patch_embed.0.weight"])
