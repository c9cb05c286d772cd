"""tools/profile_models.py --compare: models timed against each other, their runs interleaved."""
import re

from ppma.bench import profile_models


def test_compare_interleaves_every_model_and_backend(monkeypatch, capsys):
    calls = []
    seconds = {("test_ppma", "torch"): 2.0, ("test_ppma", "auto"): 1.0, ("test_mila", "torch"): 3.0,
               ("test_mila", "auto"): 0.5}

    def fake_run(model, x, backend):
        key = (model.pretrained_cfg["architecture"], backend)
        calls.append(key)
        return seconds[key] * len(calls)  # later runs slower: a ratio of medians, round by round

    monkeypatch.setattr(profile_models, "run_once", fake_run)
    profile_models.main(["test_ppma", "test_mila", "--compare", "--backends", "torch", "auto",
                         "--repeats", "3", "--size", "40", "36", "--batch-size", "1"])
    order = list(seconds)
    assert calls == order * 4  # one warm-up round, then three rounds of every case in turn
    lines = re.findall(r"^(\w+) 1x3x40x36 (\w+): ([0-9.]+) s median of 3 \(([0-9.]+)x\)$",
                       capsys.readouterr().out, re.M)
    assert [(m, b) for m, b, _, _ in lines] == order
    medians = {(m, b): float(s) for m, b, s, _ in lines}
    for i, key in enumerate(order):  # calls 5.. are the timed ones; the median is round 2's
        assert medians[key] == seconds[key] * (4 + len(order) + i + 1)
    assert [float(r) for *_, r in lines] == [round(medians[k] / medians[order[0]], 2) for k in order]


def test_compare_runs_the_real_models(capsys):
    profile_models.main(["test_ppma", "test_mila", "--compare", "--backends", "auto", "--repeats", "1",
                         "--size", "40", "36", "--batch-size", "1"])
    out = capsys.readouterr().out
    assert re.search(r"^test_ppma 1x3x40x36 auto: [0-9.]+ s median of 1 \(1\.00x\)$", out, re.M), out
    assert re.search(r"^test_mila 1x3x40x36 auto: [0-9.]+ s median of 1 \([0-9.]+x\)$", out, re.M), out
