"""Era names on the command line come from the registry: every `--metric` takes the registered eras (a new era
module included), `--era` still works where it was the spelling, and config keys naming an era are checked."""

from __future__ import annotations

import pytest

from cellseg.cli import build_parser
from cellseg.cli import main as cli
from cellseg.config.fields import check_eras
from cellseg.config.inference import EnsembleConfig, FitConfig
from cellseg.eval import eras
from cellseg.report import ReportOptions

# A fourth command line per command that takes an era: the positional arguments it needs before `--metric`.
ERA_COMMANDS = {
    "evaluate": ["sub.zip", "truth.zarr"],
    "submit": ["preds.zarr", "--out", "s.zip"],
    "validate-submission": ["sub.zip"],
    "report": ["--runs", "a", "b", "--out", "r"],
    "ensemble": ["a.zarr", "b.zarr", "--out", "e.zarr"],
    "postprocess": ["p.zarr", "--out", "s.zarr"],
}
TOY_ERA = '''
from cellseg.eval.eras.era_2026 import Era2026


class ToyEra(Era2026):
    name = "toy"
    title = "toy metric (the 2026 rules under another name)"


ERA = ToyEra()
'''


@pytest.fixture
def toy_era(tmp_path, monkeypatch):
    """A third era, registered as one more module file of the package's search path."""
    import sys

    (tmp_path / "era_toy.py").write_text(TOY_ERA)
    monkeypatch.setattr(eras, "__path__", [*eras.__path__, str(tmp_path)])
    eras.registry.cache_clear()
    yield "toy"
    eras.registry.cache_clear()
    sys.modules.pop("cellseg.eval.eras.era_toy", None)


def _metric(command: str, *flags: str) -> str:
    args = build_parser().parse_args([command, *ERA_COMMANDS[command], *flags])
    return next(v for k, v in vars(args).items() if k == "metric" or k.endswith(".metric"))


@pytest.mark.parametrize("command", ERA_COMMANDS)
def test_every_era_flag_takes_the_registered_eras_and_nothing_else(command, toy_era, capsys):
    for era in eras.registry():
        assert _metric(command, "--metric", era) == era
    assert "toy" in eras.registry()  # the new module is offered at once
    with pytest.raises(SystemExit):
        _metric(command, "--metric", "2027")
    assert "invalid choice: '2027'" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["submit", "validate-submission"])
def test_era_is_a_hidden_alias_of_metric_where_it_was_the_spelling(command, capsys):
    assert _metric(command, "--era", "2025") == "2025"
    # the default era; submit's is resolved when it runs: the era the segmentation was decided for, else 2026
    assert _metric(command) == (None if command == "submit" else "2026-07")
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    text = capsys.readouterr().out
    assert "--metric ERA" in text and "--era" not in text


def test_report_scores_all_eras_by_default_and_both_still_means_all(toy_era):
    every = tuple(eras.registry())
    assert _metric("report") == "all"
    for word in ("all", "both"):
        assert ReportOptions(runs=("a", "b"), out="r", metric=word).eras == every
    assert ReportOptions(runs=("a", "b"), out="r", metric="toy").eras == ("toy",)


def test_config_keys_naming_an_era_are_checked_against_the_registry(capsys):
    config = EnsembleConfig(fit=FitConfig(metric="2099"))  # a name: what the config itself can check
    with pytest.raises(ValueError, match=r"fit.metric='2099': not a registered scoring era; choose one of 2025, 2026"):
        check_eras(config, eras.registry())
    with pytest.raises(ValueError, match="give the name of a scoring era"):
        FitConfig(metric=2026)
    assert cli(["ensemble", "a.zarr", "b.zarr", "--out", "e.zarr", "ensemble.fit.metric='2099'"]) == 2
    assert "ensemble.fit.metric='2099': not a registered scoring era" in capsys.readouterr().err
