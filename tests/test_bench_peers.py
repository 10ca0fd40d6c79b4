"""scripts/bench_peers.py: its pieces (in scripts/benchkit/) on made-up input, and
`--smoke` end to end.

Nothing here times anything: the smoke run only has to produce a complete, consistent
report (every configuration measured or given a reason), whatever the machine's load.
"""

import json
import os
import sys

# These tests exercise the benchmark scripts themselves: scripts/ holds the benchkit
# package they are made of.
SCRIPTS = os.path.join(os.path.dirname(__file__), os.pardir, "scripts")
sys.path.insert(0, SCRIPTS)
import numpy as np
import pytest
from benchkit import harness
from benchkit.flops import training_flops
from benchkit.peers import corpus, opennmt
from benchkit.peers.results import ALL_CONFIGS, PEERS
from support import forked

SCRIPT = os.path.join(SCRIPTS, "bench_peers.py")

ONMT_LOG = """\
2026-11-30 23:25:30.378000: I runner.py:310] Number of model parameters: 28170
2026-11-30 23:25:30.999000: I runner.py:310] Step = 1 ; steps/s = 0.00, tokens/s = 0 (0 source, 0 target) ; Learning rate = 0.000001 ; Loss = 5.6
2026-11-30 23:25:31.150000: I runner.py:310] Step = 2 ; steps/s = 0.00, tokens/s = 0 (0 source, 0 target) ; Learning rate = 0.000001 ; Loss = 5.4
2026-11-30 23:25:33.150000: I runner.py:310] Step = 3 ; steps/s = 0.50, tokens/s = 2000 (900 source, 1100 target) ; Learning rate = 0.000002 ; Loss = 5.4
2026-11-30 23:25:37.150000: I runner.py:310] Step = 4 ; steps/s = 0.25, tokens/s = 1000 (400 source, 600 target) ; Learning rate = 0.000002 ; Loss = 5.4
"""


def test_parse_opennmt_log_weights_target_rates_by_update_time():
    out = opennmt.parse_opennmt_log(ONMT_LOG, warmup=2)
    # Update 3: 1100 tokens/s for 2 s; update 4: 600 tokens/s for 4 s.
    assert out["seconds"] == pytest.approx(6.0)
    assert out["tokens"] == pytest.approx(1100 * 2 + 600 * 4)
    assert out["params"] == 28170
    with pytest.raises(RuntimeError, match="no per-update"):
        opennmt.parse_opennmt_log(ONMT_LOG, warmup=4)


def test_yaml_text_gives_exponents_a_mantissa_dot():
    text = opennmt.yaml_text({"epsilon": 1e-9, "name": "w1e5", "steps": 10**7})
    assert '"epsilon": 1.0e-09' in text
    assert '"w1e5"' in text and '"steps": 10000000' in text


def test_training_flops_is_six_n_per_token_without_attention():
    spec = {"hidden_size": 8, "filter_size": 32, "vocab_size": 50, "num_layers": 2}
    batch = {"inputs": np.array([[5, 1]]), "targets": np.array([[7, 1]])}
    flops, tokens = training_flops([batch], spec)
    d, f, v, n, length = 8, 32, 50, 2, 2
    parameters = n * (4 * d * d + 2 * d * f) + n * (8 * d * d + 2 * d * f) + d * v
    attention = 3 * 4 * d * n * 3 * length**2
    assert tokens == 2
    assert flops == pytest.approx(6 * parameters * tokens + attention)


def test_synthetic_pairs_lengths_and_ids():
    pairs = corpus.synthetic_pairs(2000, 100, 25.0, 60, seed=3)
    lengths = np.array([len(s) - 1 for s, _ in pairs])
    assert lengths.min() >= 1 and lengths.max() <= 60
    assert 20 < lengths.mean() < 30
    ids = np.concatenate([np.concatenate(p) for p in pairs])
    assert all(s[-1] == 1 and t[-1] == 1 for s, t in pairs)
    assert ids.min() >= 1 and ids.max() < 100
    counts = np.bincount(ids, minlength=100)
    assert counts[2] > 5 * counts[50]  # Zipf: low ids far more frequent


@pytest.mark.slow
def test_smoke_reports_every_config(tmp_path):
    result = forked.run(
        [sys.executable, SCRIPT, "--smoke", f"--work_dir={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    configs = report["configs"]
    assert set(configs) == set(ALL_CONFIGS)
    for name in ("t2t_f32", "keras_f32", "keras_bf16"):
        assert configs[name]["status"] == "measured", configs[name]
        assert configs[name]["tokens_per_s"] > 0
    for config in configs.values():
        if config["status"] == "measured":
            rates = config["tokens_per_s_rounds"]
            assert config["tokens_per_s"] == pytest.approx(np.median(rates))
            assert 0 < config["mfu"] < 1
            assert config["params"] > 0
        else:
            assert config["status"] in ("skipped", "error") and config["reason"]
    assert configs["opennmt_f32"]["status"] in ("measured", "skipped")
    _check_ratios(report, configs)


def _check_ratios(report, configs):
    """Every (measured t2t_lite config, measured peer) pair has a ratio, equal to the
    median of its per-round tokens/s ratios."""
    measured = {n for n, c in configs.items() if c["status"] == "measured"}
    expected = {
        f"{mine}/{peer}"
        for mine in measured
        if mine.startswith("t2t")
        for peer in measured & set(PEERS)
    }
    assert set(report["ratios"]) == expected
    for pair, value in report["ratios"].items():
        mine, peer = pair.split("/")
        assert value == pytest.approx(
            harness.median_ratio(
                configs[mine]["tokens_per_s_rounds"],
                configs[peer]["tokens_per_s_rounds"],
            )
        )
