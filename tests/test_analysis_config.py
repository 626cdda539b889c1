"""The analysis' view of a stored spec (:class:`analysis.config.StoredSweep`): the same
thresholds, figures and axes as the full spec, without validating the pipeline's
sections."""

from __future__ import annotations

import logging

import pytest
import yaml
from phasesweep.analysis.config import AnalysisConfig, StoredSweep, stored_sweep
from phasesweep.pipeline.spec import SHORT_NAMES, SpecError, load_spec_and_raw
from sweep_runner import SWEEPS

from phasesweep._config import SpecError as SharedSpecError


@pytest.mark.parametrize("path", sorted(SWEEPS.glob("*.yaml")), ids=lambda p: p.stem)
def test_view_of_a_stored_sweep_agrees_with_the_full_spec(path):
    spec, raw = load_spec_and_raw(path)
    # what a launch stores: the raw dict dumped (after the header comment, pipeline.run._launch)
    view = StoredSweep.from_yaml("# header\n" + yaml.safe_dump(raw, sort_keys=False))
    assert view.analysis == spec.analysis and view.plots == spec.plots
    assert view.description == spec.description
    inverse = {v: k for k, v in SHORT_NAMES.items()}
    assert view.grid_axes == [inverse.get(a, a) for a in spec.grid]


def test_view_ignores_the_pipeline_sections_and_maps_dotted_axes():
    text = (
        "name: s\nmodel: {no_such_key: 1}\ndata: {kind: arrays}\n"
        "grid: {model.init_scale: [1, 2], data.delta: [0, 0.1], width: [4]}\n"
        "analysis: {lazy_threshold: 0.25}\nplots: [{kind: loss_curves}]\n"
    )
    view = StoredSweep.from_yaml(text)
    assert view.grid_axes == ["init_scale", "data.delta", "width"]
    assert view.analysis == AnalysisConfig(lazy_threshold=0.25)
    assert [p.kind for p in view.plots] == ["loss_curves"]


@pytest.mark.parametrize(
    "text, key",
    [
        ("analysis: {lazy_treshold: 0.2}", "analysis.lazy_treshold"),
        ("analysis: {lazy_threshold: -1}", "analysis.lazy_threshold"),
        ("plots: [{kind: loss_curves, hue: [1]}]", "plots.0.hue"),
        ("grid: [1, 2]", "grid"),
        ("- 1\n- 2", "<spec>"),
        ("a: [1", "<spec>"),
    ],
)
def test_bad_analysis_sections_name_the_key(text, key, caplog):
    with pytest.raises(SpecError) as e:
        StoredSweep.from_yaml(text)
    assert e.value.key == key and "\n" not in str(e.value)
    assert SpecError is SharedSpecError  # one error class, whichever module it comes from
    with caplog.at_level(logging.WARNING):
        assert stored_sweep(text, "s") is None  # the analysis then uses the defaults
    assert "stored spec of sweep s does not validate" in caplog.text
    assert stored_sweep(None, "s") is None
