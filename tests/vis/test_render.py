"""ppma.vis.render: panel counts, pixel sizes, and that the mask panel peaks at the query."""
import numpy as np
import pytest
import torch

pytest.importorskip("matplotlib", reason="ppma.vis.render draws with matplotlib (the 'vis' extra)")
from PIL import Image  # noqa: E402

from ppma.vis import capture_attention  # noqa: E402
from ppma.vis.render import (  # noqa: E402
    attention_figure,
    decay_figure,
    figure8_panels,
    figure_to_image,
    mask_figure,
    query_gif,
    raster_queries,
)

PANEL, DPI = 1.0, 40  # 40 x 40 px panels


def _records(model, x):
    with torch.no_grad(), capture_attention(model) as records:
        model(x)
    return list(records.values())


def _panels(fig):
    return [ax for ax in fig.axes if ax.get_visible()]


@pytest.fixture(scope="module")
def image():
    return np.random.default_rng().integers(0, 256, size=(48, 80, 3), dtype=np.uint8)


def test_figure8_has_six_panels_per_layer_and_the_expected_size(micro_model, image, tmp_path):
    records = _records(micro_model(("criss_cross", "linear", "vanilla", "vanilla")), torch.randn(1, 3, 48, 80))
    fig = attention_figure(image, records, (70.0, 10.0), head=0, panel_inches=PANEL, dpi=DPI)
    panels = _panels(fig)
    assert len(panels) == 4 * 6
    titles = [ax.get_title().split(" ")[0] for ax in panels[:6]]
    assert titles == ["input", "alpha", "beta", "softmax(QK^T)", "mask", "masked"]
    assert figure_to_image(fig).size == (6 * 40, 4 * 40)
    fig.savefig(tmp_path / "fig.png")
    assert Image.open(tmp_path / "fig.png").size == (6 * 40, 4 * 40)
    # The mask panel of every layer peaks in the grid cell of the query (x=70, y=10).
    for rec, row in zip(records, np.array(panels).reshape(4, 6)):
        heat = row[4].get_images()[1].get_array()
        y, x = np.unravel_index(np.argmax(heat), heat.shape)
        cell_h, cell_w = 48 / rec.grid_shape[0], 80 / rec.grid_shape[1]
        assert abs(y - 10) <= cell_h and abs(x - 70) <= cell_w, (rec.name, (x, y))


def test_3d_layers_render_one_row_per_frame(micro_model):
    model = micro_model(("criss_cross", "vanilla", "linear", "vanilla"), name="ppma_tiny_3d")
    records = _records(model, torch.randn(1, 3, 3, 32, 32))[:2]
    clip = np.random.default_rng().integers(0, 256, size=(3, 32, 32, 3), dtype=np.uint8)
    fig = attention_figure(clip, records, (5.0, 20.0), frame=2, panel_inches=PANEL, dpi=DPI)
    assert figure8_panels(records[0])[:4] == ["input", "alpha", "beta", "gamma"]
    assert len(_panels(fig)) == 2 * 3 * 7
    assert figure_to_image(fig).size == (7 * 40, 6 * 40)
    assert len(_panels(mask_figure(clip, records[0], (5.0, 20.0), frame=1, panel_inches=PANEL, dpi=DPI))) == 3 * 3
    with pytest.raises(ValueError, match="clip"):
        attention_figure(clip[0], records, (5.0, 20.0))
    with pytest.raises(ValueError, match="frame 3 is out of range"):
        attention_figure(clip, records, (5.0, 20.0), frame=3)


def test_decay_and_mask_figures(micro_model, image):
    records = _records(micro_model(), torch.randn(1, 3, 48, 80))[:2]  # 1 and 2 heads
    fig = decay_figure(image, records, panel_inches=PANEL, dpi=DPI)
    assert len(_panels(fig)) == 1 * 2 + 2 * 2
    assert figure_to_image(fig).size == (4 * 40, 2 * 40)
    fig = mask_figure(image, records[1], (3.0, 40.0), head=1, panel_inches=PANEL, dpi=DPI)
    assert [ax.get_title().split(" ")[0] for ax in _panels(fig)] == ["v2h", "h2v", "both"]
    with pytest.raises(ValueError, match="head 2 is out of range"):
        mask_figure(image, records[1], (3.0, 40.0), head=2)
    with pytest.raises(ValueError, match="outside the image"):
        mask_figure(image, records[1], (80.0, 4.0))


def test_query_gif_has_one_frame_per_query(micro_model, image, tmp_path):
    rec = _records(micro_model(), torch.randn(1, 3, 48, 80))[0]
    queries = raster_queries(image.shape[:2], (2, 3))
    assert queries[:4] == [(80 / 6, 12.0), (40.0, 12.0), (400 / 6, 12.0), (400 / 6, 36.0)]  # serpentine
    path = query_gif(image, rec, queries, tmp_path / "q.gif", panel_inches=PANEL, dpi=DPI)
    with Image.open(path) as gif:
        assert gif.n_frames == 6
        assert gif.size == (4 * 40, 40)
