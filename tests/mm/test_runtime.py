"""ppma.mm.runtime (CPU adaptations of configs), ppma.mm.serialization (weights_only loading) and
importing ppma.mm with only one of mmdet/mmseg."""
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("mmdet", reason="mmdet is not installed (pip install 'ppma[mm]'); CI installs it")
from mmengine.config import Config  # noqa: E402
from mmengine.logging import HistoryBuffer  # noqa: E402

from ppma.mm.runtime import prepare_for_device, replace_sync_bn  # noqa: E402


class NotAllowed:
    pass


def test_replace_sync_bn():
    cfg = dict(a=dict(type="SyncBN", requires_grad=True), b=[dict(norm_cfg=dict(type="SyncBN"))],
               c=dict(type="BN"))
    assert replace_sync_bn(cfg) == 2
    assert cfg["a"]["type"] == cfg["b"][0]["norm_cfg"]["type"] == "BN" and cfg["a"]["requires_grad"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="adapts configs only where CUDA is missing")
def test_prepare_for_a_cpu_process():
    cfg = Config(dict(model=dict(decode_head=dict(norm_cfg=dict(type="SyncBN"))), env_cfg=dict()))
    prepare_for_device(cfg, "none")
    assert cfg.model.decode_head.norm_cfg.type == "BN"
    assert "model_wrapper_cfg" not in cfg


def test_training_checkpoints_load_with_weights_only(tmp_path):
    buffer = HistoryBuffer()
    buffer.update(np.float64(0.25))
    path = tmp_path / "iter_1.pth"
    torch.save({"state_dict": {"w": torch.ones(2)},
                "meta": {"message_hub": {"log_scalars": {"loss": buffer}}, "seed": np.int64(3),
                         "ratios": np.arange(3, dtype=np.float32)}}, path)
    loaded = torch.load(path, weights_only=True)
    assert loaded["meta"]["message_hub"]["log_scalars"]["loss"].current() == 0.25
    assert loaded["meta"]["seed"] == 3
    torch.save({"bad": NotAllowed()}, tmp_path / "bad.pth")
    with pytest.raises(pickle.UnpicklingError, match="NotAllowed"):
        torch.load(tmp_path / "bad.pth", weights_only=True)
    torch.save({"method": np.ndarray.tofile}, tmp_path / "getattr.pth")  # getattr(ndarray, 'tofile')
    with pytest.raises(pickle.UnpicklingError, match="only allows HistoryBuffer's statistics methods"):
        torch.load(tmp_path / "getattr.pth", weights_only=True)


BLOCK_AND_IMPORT = """
import sys

class Uninstalled:  # makes the packages named on the command line look uninstalled
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in sys.argv[1].split(","):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Uninstalled())
import ppma.mm
print(ppma.mm.REGISTERED_IN)
"""


@pytest.mark.parametrize("missing, registered", [("mmseg", "('mmdet',)"), ("mmdet", "('mmseg',)"),
                                                 ("mmdet,mmseg", "()"), ("mmdet,mmseg,mmpretrain", None)])
def test_import_with_one_of_mmdet_mmseg(missing, registered):
    pytest.importorskip("mmseg", reason="mmseg is not installed")
    if registered == "()":
        pytest.importorskip("mmpretrain", reason="mmpretrain is not installed")
    result = subprocess.run([sys.executable, "-c", BLOCK_AND_IMPORT, missing], capture_output=True, text=True)
    if registered:
        assert result.returncode == 0 and result.stdout.strip() == registered, result.stderr
    else:
        assert result.returncode != 0 and "ppma.mm needs mmdet, mmseg or mmpretrain" in result.stderr, result.stderr
