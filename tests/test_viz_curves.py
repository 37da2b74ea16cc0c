"""Training curves widget (packsim.viz.curves): results format, seed spread, live throttling."""

from __future__ import annotations

import json

import pytest

from packsim.core.errors import PacksimError
from packsim.experiment.results import Results, RunResult, StepRecord
from packsim.viz import curves, curves_figure
from packsim.viz.widget import shown_figure


def _run(setup: str, seed: int, steps: int = 6, offset: float = 0.0) -> RunResult:
    r = RunResult(setup=setup, seed=seed)
    for s in range(1, steps + 1):
        r.add(
            StepRecord(
                "train",
                setup,
                seed,
                s,
                {"reported_loss": 3.0 / s + offset, "response_loss": 2.0 / s + offset},
            )
        )
        if s % 3 == 0:
            r.add(
                StepRecord(
                    "eval",
                    setup,
                    seed,
                    s,
                    {
                        "isolated_exact_match": 0.1 * s + offset,
                        "isolated_response_loss": 1.0 / s,
                        "packed_response_loss": 1.0 / s,
                    },
                )
            )
    return r


@pytest.fixture
def results() -> Results:
    runs = [_run("buggy", 0), _run("buggy", 1, offset=0.2), _run("correct", 0), _run("correct", 1)]
    return Results(runs=runs, config={}, env={})


KEY = "panel 1 key"  # the legend group of panel 1's two grey key entries


def _traces(fig: dict, axis: str = "x") -> list[dict]:
    return [t for t in fig["data"] if t.get("xaxis", "x") == axis and t.get("legendgroup") != KEY]


def _setup_names(fig: dict) -> set[str]:
    return {t["name"] for t in fig["data"] if t.get("name") and t.get("legendgroup") != KEY}


def test_mean_and_band_over_seeds(results):
    view = curves(results)
    assert "packsim-curves" in view.widget._dom_classes
    fig = shown_figure(view.out)
    assert fig is not None and len(_traces(fig, "x") + _traces(fig, "x2") + _traces(fig, "x3")) == 2 * 2 * 4
    # 2 setups x (band + mean) x 4 lines, and the two key entries
    assert [t["name"] for t in fig["data"] if t.get("legendgroup") == KEY] == [
        "panel 1: reported loss", "panel 1: its response-only part"]
    reported = _traces(fig, "x")
    band, mean = reported[0], reported[1]
    assert mean["name"].startswith("buggy (mean of 2 seeds")
    assert mean["x"] == [1, 2, 3, 4, 5, 6]
    assert mean["y"][1] == pytest.approx((1.5 + 1.7) / 2)  # step 2: seeds 0 and 1
    assert band["fill"] == "toself"
    assert band["y"][:6] == pytest.approx([3.0 / s + 0.2 for s in range(1, 7)])  # max, forward
    assert band["y"][6:] == pytest.approx([3.0 / s for s in range(6, 0, -1)])  # min, back
    em = [t for t in _traces(fig, "x3") if t.get("name")]
    assert [t["x"] for t in em] == [[3, 6], [3, 6]] and em[0]["y"] == pytest.approx([0.4, 0.7])
    colours = {t["line"]["color"] for t in fig["data"] if t.get("name") and t["legendgroup"] != KEY}
    assert len(colours) == 2  # one colour per setup


def test_single_seed_has_no_band():
    fig = curves_figure([_run("correct", 0)])
    assert all(t.fill is None for t in fig.data)
    assert [t.name for t in fig.data if t.showlegend is not False] == [
        "correct", "panel 1: reported loss", "panel 1: its response-only part"]


def test_each_reported_loss_sits_beside_its_own_response_only_loss(results):
    """Panel 1 pairs each setup's reported loss (thick, filled markers) with its train response
    loss (thin, open markers), as the legend's key entries say; panel 2 holds only the held-out
    response loss, the same quantity for every setup. A setup's dash and marker shape are its own
    in every panel (one encoding: dash never means anything else)."""
    from packsim.viz.style import setup_dash, setup_symbol

    fig = curves_figure(results)
    panel1 = [t for t in fig.data if t.xaxis == "x" and t.name and t.legendgroup != KEY]
    assert len(panel1) == 4
    for t in panel1:
        part = t.marker.symbol.endswith("-open")
        key = "response_loss" if part else "reported_loss"
        assert f"{t.legendgroup} {key}" in t.hovertemplate
        assert t.line.width == (1.2 if part else 2.5)
    assert sorted(t.marker.symbol.endswith("-open") for t in panel1) == [False, False, True, True]
    key = {t.name: t for t in fig.data if t.legendgroup == KEY}
    assert key["panel 1: reported loss"].line.width == 2.5
    assert key["panel 1: its response-only part"].marker.symbol == "circle-open"
    setup_lines = [t for t in fig.data if t.name and t.legendgroup != KEY]
    assert all(t.line.dash == setup_dash(t.legendgroup) for t in setup_lines)
    assert all(t.marker.symbol.removesuffix("-open") == setup_symbol(t.legendgroup) for t in setup_lines)
    panel2 = [t for t in setup_lines if t.xaxis == "x2"]
    assert len({t.line.dash for t in panel2}) == 2 and len({t.marker.symbol for t in panel2}) == 2
    assert all("isolated_response_loss" in t.hovertemplate for t in panel2)
    assert "(thick)" in fig.layout.annotations[0].text and "(thin)" in fig.layout.annotations[0].text
    assert "<br>" in fig.layout.annotations[0].text and fig.layout.annotations[0].text.count("<br>") == 1  # 2 lines


def test_panels_without_data_say_what_they_wait_for():
    """Before the first eval, the eval panels hold a note instead of empty axes with titles."""
    def notes(fig):
        return {a.xref: a.text for a in fig.layout.annotations if "waiting" in (a.text or "")}

    empty = curves_figure([])
    assert notes(empty) == {"x domain": "<i>waiting for the first training step</i>",
                            "x2 domain": "<i>waiting for the first evaluation</i>",
                            "x3 domain": "<i>waiting for the first evaluation</i>"}
    view = curves(every=1)
    view.callback(StepRecord("train", "buggy", 0, 1, {"reported_loss": 1.0, "response_loss": 2.0}))
    assert set(notes(view.figure())) == {"x2 domain", "x3 domain"}
    assert "waiting for the first evaluation" in view.status.value
    view.callback(StepRecord("eval", "buggy", 0, 1, {"isolated_response_loss": 1.5,
                                                      "isolated_exact_match": 0.25}))
    assert notes(view.figure()) == {} and "waiting" not in view.status.value
    assert "isolated exact match 0.25" in view.status.value


def test_live_callback_throttles_train_and_always_draws_eval():
    view = curves(every=5, min_interval_s=1e9)
    assert view.n_draws == 1 and "No runs yet" in view.status.value
    for s in range(1, 5):
        view.callback(StepRecord("train", "buggy", 0, s, {"reported_loss": 1.0 / s}))
    assert view.n_draws == 1  # 4 records < every
    view.callback(StepRecord("train", "buggy", 0, 5, {"reported_loss": 0.2}))
    assert view.n_draws == 2
    fig = shown_figure(view.out)
    assert fig["data"][0]["x"] == [1, 2, 3, 4, 5]
    view.callback(StepRecord("eval", "buggy", 0, 5, {"isolated_exact_match": 0.25}))
    assert view.n_draws == 3  # eval records always draw
    assert [t["y"] for t in shown_figure(view.out)["data"] if t["xaxis"] == "x3"] == [[0.25]]
    assert "step 5" in view.status.value and "0.200" in view.status.value
    view.callback(
        {
            "kind": "train",
            "setup": "correct",
            "seed": 0,
            "step": 1,
            "values": {"reported_loss": 2.0},
        }
    )  # a dict record works too
    view.redraw()
    assert _setup_names(shown_figure(view.out)) == {"buggy", "correct"}
    assert view.n_records == 7


def test_time_based_throttle():
    view = curves(every=1000, min_interval_s=0.0)
    for s in range(3):
        view(StepRecord("train", "correct", 0, s, {"reported_loss": 1.0}))  # callable itself
    assert view.n_draws == 1 + 3


def test_a_seed_still_training_does_not_cut_the_other():
    view = curves([_run("buggy", 0, steps=6)])
    view.callback(StepRecord("train", "buggy", 1, 1, {"reported_loss": 5.0}))
    view.redraw()
    mean = [t for t in shown_figure(view.out)["data"] if t.get("name") and t["xaxis"] == "x"][0]
    assert mean["x"] == [1, 2, 3, 4, 5, 6] and mean["y"][0] == pytest.approx((3.0 + 5.0) / 2)


def test_loads_results_json_and_data_sets(tmp_path, results):
    results.runs.append(_run("correct", 0, steps=3))
    results.runs[-1].data = "facts"
    path = results.save(tmp_path / "results.json")
    json.loads(path.read_text())
    view = curves(tmp_path)  # a directory holding results.json
    assert list(view.data.options) == ["tasks", "facts"] and not view.data.disabled
    view.data.value = "facts"
    fig = shown_figure(view.out)
    assert _setup_names(fig) == {"correct"}
    assert fig["data"][0]["x"] == [1, 2, 3]


def test_data_dropdown_says_why_it_is_disabled(tmp_path, results):
    view = curves(results)  # one data design: nothing to switch to
    assert view.data.disabled
    assert "Only one data design (tasks)" in view.data.tooltip
    assert "Only one data design (tasks)" in view.data_note.value
    results.runs.append(_run("correct", 0, steps=3))
    results.runs[-1].data = "facts"
    view = curves(results)
    assert not view.data.disabled and view.data_note.value == ""
    assert "Only one" not in view.data.tooltip


def test_report_html_figures_are_offline(tmp_path, results):
    from packsim.viz.comparison_report import write_report

    page = write_report(results, tmp_path / "report.html").read_text()
    n_figures = page.count("Plotly.newPlot(")
    assert n_figures >= 1
    assert page.count('"displaylogo": false') == n_figures
    assert page.count('"showSendToCloud": false') == n_figures


def test_bad_input():
    with pytest.raises(PacksimError, match="results.json"):
        curves(42)
    with pytest.raises(PacksimError, match="no results"):
        curves("/nonexistent/dir")
    view = curves()
    with pytest.raises(PacksimError, match="StepRecord"):
        view.callback(StepRecord("test", "buggy", 0, 1, {}))
    with pytest.raises(PacksimError, match="not a step record"):
        view.callback({"kind": "train"})
    with pytest.raises(PacksimError, match="every"):
        curves(every=0)


def test_fed_live_by_the_real_trainer():
    """The trainer's callback drives the widget: one point per step, eval drawn at once."""
    from packsim.core.data import make_examples
    from packsim.core.model import build_model
    from packsim.experiment.training import TrainConfig, train

    view = curves(every=100, min_interval_s=1e9)
    cfg = TrainConfig(steps=3, examples_per_step=4, capacity=64, warmup_steps=1, eval_every=0)
    run = train(
        build_model("tiny", seed=0),
        make_examples(12, seed=0),
        "buggy",
        cfg,
        seed=0,
        evaluate=lambda model, step: {"isolated_exact_match": 0.5},
        callback=view.callback,
        progress=False,
    )
    fig = shown_figure(view.out)  # the eval record after the last step forced a draw
    reported = [t for t in fig["data"] if t.get("name") and t["xaxis"] == "x"][0]
    cols = run.curves["train"]
    assert reported["x"] == cols["step"] and reported["y"] == pytest.approx(cols["reported_loss"])
    assert [t["y"] for t in fig["data"] if t["xaxis"] == "x3"] == [[0.5]]
