"""Every metric a trainer logs is defined in one glossary (training/metric_keys.py)."""

import pytest

from agentic_rl.training.metric_keys import GLOSSARY, describe_metric, glossary_key
from agentic_rl.training.run_dir import RunDir


def test_pattern_keys_match_one_path_segment():
    """Guards against a glossary pattern like reward/{term}/mean matching nested or un-namespaced keys, so an
    undefined metric would pass as defined."""
    assert glossary_key("loss/total") == "loss/total"
    assert glossary_key("reward/accuracy/mean") == "reward/{term}/mean"
    assert glossary_key("reward/reward_model/std") == "reward/{term}/std"
    assert glossary_key("rollout/finish/max_turn_tokens") == "rollout/finish/{reason}"
    assert glossary_key("reward/a/b/mean") is None  # {term} is one segment
    assert glossary_key("loss") is None  # no un-namespaced keys
    assert describe_metric("rollout/staleness") == GLOSSARY["rollout/staleness"]


def test_every_key_is_namespaced_and_defined():
    """Guards against metric names outside the documented namespaces (STYLE 8) and against glossary entries
    without a real definition."""
    for key, meaning in GLOSSARY.items():
        assert "/" in key and key.split("/")[0] in {
            "loss",
            "optim",
            "time",
            "memory",
            "reward",
            "rollout",
            "train",
            "value",
            "sft",
            "rm",
        }, key
        assert meaning.endswith(".") and len(meaning) > 20, key


def test_logging_an_undefined_metric_fails_and_names_the_glossary(tmp_path):
    """Guards against a metric that reaches metrics.jsonl without a definition."""
    run = RunDir(tmp_path / "run", {"x": 1})
    with pytest.raises(KeyError, match="metric_keys.py"):
        run.log(1, {"loss/total": 0.5, "reward/accuracy/mean": 1.0, "my_new_metric": 2.0})
    run.log(1, {"loss/total": 0.5, "reward/accuracy/mean": 1.0})
    run.close()
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") == 1
