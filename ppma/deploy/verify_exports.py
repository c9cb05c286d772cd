"""Export every preset of the families (classifier and ``features_only``) to ONNX and verify it in
ONNX Runtime against eager PyTorch, through :mod:`ppma.deploy.export` (``export_one(..., verify=True)``:
the example size, batch 1 at the odd size 97x131, and batch + 1 at H + 32 x W + 16).

    python tools/verify_exports.py --output DIR [--models NAME ...] [--families ppma vim ...]
                                   [--img-size H W] [--no-optimize] [--keep]

One JSON line per export is appended to ``DIR/results.jsonl`` (``model``, ``features``,
``seconds``, ``errors`` per shape, ``max_error``, ``ok``, or ``error``: the exception); a model
already in it is skipped, so an interrupted run resumes. ``--no-optimize``: skip the ONNX
exporter's graph optimizer (about half of an export's time). ``--keep`` keeps the ``.onnx`` files
(``DIR/NAME[_features].onnx``; ``tools/benchmark.py --onnx-dir DIR`` reuses them). Exit status 1
when an export fails or a max relative error is above :data:`ppma.deploy.export.TOLERANCE` (1e-4).
Exports take minutes per preset on 2 cores: run it in the background (``nice``).
"""
from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path


def presets(models=None, family_names=None) -> list[str]:
    """``models`` as given, else every preset of ``family_names`` (default: all families)."""
    from ppma.models.family import families

    if models:
        return list(models)
    known = {f.name: f for f in families()}
    unknown = set(family_names or ()) - set(known)
    if unknown:
        raise ValueError(f"unknown families {sorted(unknown)}; known: {sorted(known)}")
    return [p for name, f in known.items() if not family_names or name in family_names for p in f.presets]


def done(results: Path) -> set[tuple[str, bool]]:
    """``(model, features)`` pairs already in ``results``."""
    if not results.exists():
        return set()
    return {(r["model"], r["features"]) for r in map(json.loads, results.read_text().splitlines()) if r}


def verify(export, name: str, features: bool, out_dir: Path, img_size=None, keep=False, optimize=True) -> dict:
    """Export ``name`` and verify it; the result record (see the module docstring)."""
    path = out_dir / f"{name}{'_features' if features else ''}.onnx"
    record = {"model": name, "features": features}
    try:
        report = export.export_one(name, path, "onnx", features=features, img_size=img_size, verify=True,
                                   optimize=optimize)
    except Exception as err:  # noqa: BLE001 -- recorded, the run goes on with the next preset
        traceback.print_exc()
        return {**record, "ok": False, "error": f"{type(err).__name__}: {err}"}
    finally:
        if not keep:
            path.unlink(missing_ok=True)
    errors = {"x".join(map(str, s)): e for s, e in report["errors"].items()}
    worst = max(errors.values())
    return {**record, "seconds": round(report["seconds"], 1), "errors": errors, "max_error": worst,
            "ok": worst <= export.TOLERANCE}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", required=True, help="folder for results.jsonl (and the .onnx files)")
    parser.add_argument("--models", nargs="+", help="presets (default: every preset of --families)")
    parser.add_argument("--families", nargs="+", help="family names (default: all)")
    parser.add_argument("--img-size", type=int, nargs=2, metavar=("H", "W"), help="example size")
    parser.add_argument("--no-optimize", dest="optimize", action="store_false",
                        help="skip the ONNX exporter's graph optimizer (faster export)")
    parser.add_argument("--keep", action="store_true", help="keep the .onnx files")
    args = parser.parse_args(argv)
    from . import export

    out_dir = Path(args.output)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = out_dir / "results.jsonl"
    finished = done(results)
    ok = True
    for name in presets(args.models, args.families):
        for features in (False, True):
            if (name, features) in finished:
                continue
            record = verify(export, name, features, out_dir, args.img_size, args.keep, args.optimize)
            with results.open("a") as f:
                f.write(json.dumps(record) + "\n")
            print(json.dumps(record), flush=True)
            ok &= record["ok"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
