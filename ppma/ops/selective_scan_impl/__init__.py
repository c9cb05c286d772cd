"""The ``selective_scan`` op (Mamba's S6 scan, grouped B/C): sequential reference (the tests'
oracle), chunked PyTorch path (the torch backend), public function (Triton kernel on CUDA)."""
from .chunked import selective_scan_chunked
from .op import selective_scan
from .reference import selective_scan_reference

__all__ = ["selective_scan", "selective_scan_chunked", "selective_scan_reference"]
