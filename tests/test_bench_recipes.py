"""scripts/bench_recipes.py: the report's arithmetic on made-up runs, the recipe
table, and `--smoke` end to end on parallel text this test writes.

Nothing here compares recipes: the smoke run only has to produce a complete,
consistent report (every recipe trained and evaluated at every mark, or given its
one-line error), whatever the machine's load.
"""

import json
import os
import sys
import types

# These tests exercise the benchmark scripts themselves: scripts/ holds the benchkit
# package they are made of.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "scripts"))
import bench_recipes
import pytest
from benchkit.recipes import report as recipe_report
from support import forked

from t2t_lite.data.numbers_problem import write_numbers_files

SCRIPT = os.path.join(os.path.dirname(bench_recipes.__file__), "bench_recipes.py")
MARK_KEYS = {
    "mark_seconds",
    "train_seconds",
    "wall_seconds",
    "cpu_seconds",
    "micro_steps",
    "updates",
    "tokens_seen",
    "tokens_per_update",
    "dev_loss",
    "bleu",
}


def _run(recipe, seed, losses, tokens, filler=False):
    """A made-up successful run with one mark per minute."""
    marks = [
        {
            "mark_seconds": 60.0 * (i + 1),
            "train_seconds": 60.0 * (i + 1),
            "wall_seconds": 61.0 * (i + 1),
            "cpu_seconds": 61.0 * (i + 1) * 0.9,
            "micro_steps": 10 * (i + 1),
            "updates": 5 * (i + 1),
            "tokens_seen": t,
            "tokens_per_update": 100,
            "dev_loss": loss,
            "bleu": 10.0 * (i + 1),
        }
        for i, (loss, t) in enumerate(zip(losses, tokens))
    ]
    return {
        "recipe": recipe,
        "hparams": "",
        "seed": seed,
        "core": 0,
        "filler": filler,
        "status": "ok",
        "marks": marks,
    }


def test_interpolate_and_first_crossing():
    assert recipe_report.interpolate([1, 3], [10, 30], 2) == pytest.approx(20)
    assert recipe_report.interpolate([1, 3], [10, 30], 0.5) is None
    assert recipe_report.first_crossing([60, 120], [2.0, 1.0], 1.5) == (90, False)
    assert recipe_report.first_crossing([60, 120], [1.0, 0.5], 1.5) == (60, True)
    assert recipe_report.first_crossing([60, 120], [2.0, 1.8], 1.5) == (None, False)


def test_summary_times_to_the_reference_loss_and_equal_tokens():
    results = [
        _run("fixed4", 1, [2.0, 1.5, 1.0], [100, 200, 300]),
        _run("fast", 1, [1.5, 1.0, 0.5], [100, 200, 400]),
        _run("fixed4", 9, [9.0, 9.0, 9.0], [100, 200, 300], filler=True),
        {"recipe": "broken", "hparams": "x=1", "seed": None, "core": None}
        | {"filler": False, "status": "error", "error": "HParamsError: no x"},
    ]
    recipes = {"fixed4": "", "fast": "", "broken": "x=1"}
    summary = recipe_report.summarize(results, recipes, "fixed4", [60, 120, 180])
    assert summary["target_loss"] == 1.0  # the filler run is not averaged in
    fast = summary["recipes"]["fast"]
    assert fast["to_target"]["seconds"] == pytest.approx(120)
    assert fast["to_target"]["seconds_ratio"] == pytest.approx(120 / 180)
    assert fast["to_target"]["tokens"] == pytest.approx(200)
    assert summary["token_levels"] == [75, 150, 300]
    # fast at 300 tokens: halfway between its marks at 200 and 400 tokens.
    assert fast["at_tokens"][2]["dev_loss"] == pytest.approx(0.75)
    assert fast["at_tokens"][0]["dev_loss"] is None  # before its first mark
    assert fast["end"]["core_share"] == pytest.approx(0.9)
    assert summary["recipes"]["broken"]["status"] == "error"
    text = recipe_report.markdown(summary)
    assert "**failed**: HParamsError: no x" in text
    # The noise table: the filler seed marked; spread (9 - 1) / median 5.
    assert "| fixed4 | 1, 9* | 1, 9 | 160.0% |" in text


def _args(**values):
    defaults = {"recipe": [], "recipes": "fixed1,ramp", "reference": "fixed4"}
    defaults |= {"batch_size": 1000, "repeats": 2, "random_seed": 5}
    return types.SimpleNamespace(**(defaults | values))


def test_recipes_fill_in_batch_sizes_and_add_the_reference_and_ad_hoc_ones():
    recipes = bench_recipes.chosen_recipes(_args(recipe=["mine=clip_grad_norm=1.0"]))
    assert list(recipes) == ["fixed4", "fixed1", "ramp", "mine"]
    assert recipes["ramp"] == "batch_size_schedule=linear:1000,4000,200"
    assert recipes["mine"] == "clip_grad_norm=1.0"
    assert "{" not in "".join(bench_recipes.chosen_recipes(_args(recipes="all")))


def test_jobs_fill_the_last_group_with_a_seed_of_the_reference():
    recipes = {"fixed4": "", "a": "", "b": "", "failed": ""}
    runnable = ["fixed4", "a", "b"]
    jobs = bench_recipes.plan_jobs(_args(cores_list=[0, 1]), recipes, runnable)
    assert jobs[:3] == [("fixed4", 5, False), ("a", 5, False), ("b", 5, False)]
    assert len(jobs) == 6 and not any(filler for *_, filler in jobs)
    jobs = bench_recipes.plan_jobs(
        _args(cores_list=[0, 1], repeats=1), recipes, runnable
    )
    assert jobs == [
        ("fixed4", 5, False),
        ("a", 5, False),
        ("b", 5, False),
        ("fixed4", 6, True),
    ]


def test_the_noam_constant_keeps_transformer_base_peak_rate_unless_given():
    def peak(constant, warmup, hidden):  # Noam at its peak, update = warmup
        return constant * hidden**-0.5 * warmup**-0.5

    for warmup in (40, 100, 8000):
        args = bench_recipes.parse_args([f"--warmup_steps={warmup}"])
        constant = bench_recipes.learning_rate_constant(args)
        assert peak(constant, warmup, 256) == pytest.approx(peak(2.0, 8000, 256))
        hparams = bench_recipes.common_hparams(args)
        assert f"learning_rate_constant={constant:.6g}," in hparams
    given = bench_recipes.parse_args(["--learning_rate_constant=2"])
    assert bench_recipes.learning_rate_constant(given) == 2.0
    assert "learning_rate_constant=2," in bench_recipes.common_hparams(given)


@pytest.mark.parametrize("flag", ["--learning_rate_constant=0", "--warmup_steps=-4"])
def test_a_rate_that_is_not_positive_is_one_line(flag, tmp_path):
    result = forked.run(
        [sys.executable, SCRIPT, flag, f"--work_dir={tmp_path}/work"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2, result.stderr
    # TensorFlow's start-up lines come first (the script imports it); the error is
    # the one line after them.
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "bench_recipes.py: error: --learning_rate_constant and --warmup_steps "
        "must be > 0."
    )
    assert not os.path.exists(tmp_path / "work")


@pytest.mark.slow
def test_smoke_reports_every_recipe_at_every_mark(tmp_path):
    text = {}
    for split, size, seed in (("train", 2000, 1), ("dev", 60, 2)):
        text[split] = (str(tmp_path / f"{split}.en"), str(tmp_path / f"{split}.fr"))
        write_numbers_files(*text[split], size, seed=seed)
    result = forked.run(
        [sys.executable, SCRIPT, "--smoke", f"--work_dir={tmp_path / 'work'}"]
        + [f"--train_source={text['train'][0]}", f"--train_target={text['train'][1]}"]
        + [f"--dev_source={text['dev'][0]}", f"--dev_target={text['dev'][1]}"]
        + ["--vocab_size=100", "--recipe=broken=no_such_hparam=1"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["benchmark"] == "bench_recipes"
    assert report["problem"] == "translate_parallel_text"
    recipes = report["recipes"]
    assert list(recipes) == ["fixed4", "adaptive", "broken"]
    assert recipes["broken"]["status"] == "error"
    assert "no_such_hparam" in recipes["broken"]["error"]
    for name in ("fixed4", "adaptive"):
        recipe = recipes[name]
        assert recipe["status"] == "ok", recipe.get("error")
        (run,) = recipe["runs"]
        marks = run["marks"]
        assert len(marks) == len(report["mark_seconds"]) == 3
        for mark, planned in zip(marks, report["mark_seconds"]):
            assert MARK_KEYS <= set(mark)
            assert mark["train_seconds"] >= planned
            assert mark["dev_loss"] > 0 and 0 <= mark["bleu"] <= 100
        assert [m["tokens_seen"] for m in marks] == sorted(
            m["tokens_seen"] for m in marks
        )
        assert marks[-1]["tokens_seen"] > 0 and "bleu_final_decode" in marks[-1]
        assert recipe["end"]["dev_loss"] == marks[-1]["dev_loss"]
    assert report["target_loss"] == recipes["fixed4"]["end"]["dev_loss"]
    assert recipes["fixed4"]["to_target"]["seconds_ratio"] == pytest.approx(1.0)
    assert os.path.exists(report["figure"])
    assert "| broken | **failed**: HParamsError" in result.stdout
