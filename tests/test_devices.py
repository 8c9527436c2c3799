"""`rollout.device`: every command that loads a model to decode or score outside the training loop
loads it on the configured device (models/device.py), and a GPU that is not there stops the run
before any model loads.

The loader is replaced by a recorder that stops the command as soon as it is called, so each case
costs a config load, not a model load. torch.cuda.is_available is pinned to False (this machine's
truth; on a GPU machine the test then still describes a CPU-only one).
"""

from __future__ import annotations

import pytest
import torch

from agentic_rl.cli import main
from agentic_rl.config import load_config
from agentic_rl.evaluation.config import EvalConfig
from agentic_rl.rollout.config import RolloutConfig


class _Loaded(Exception):
    """Raised by the recording loader: the command got as far as loading its model."""


@pytest.fixture
def loads(monkeypatch):
    """The (name, dtype, device) of every model load; the first one stops the command."""
    import agentic_rl.models.device as device_module
    import agentic_rl.models.stage_output as stage_output

    calls = []

    def recording_loader(name, dtype, device=None):
        calls.append((name, dtype, device))
        raise _Loaded(name)

    monkeypatch.setattr(stage_output, "load_base_and_tokenizer", recording_loader)
    monkeypatch.setattr(device_module, "load_base_and_tokenizer", recording_loader)  # load_for_decoding's own name
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    return calls


def _cli(*argv: str):
    def run(device: str | None, tmp_path) -> None:
        rc = main([*argv, *(["--device", device] if device else [])])
        if rc == 2:
            raise ValueError("the command stopped with exit code 2 (message on stderr)")
        raise AssertionError(f"the command returned {rc} without loading a model")

    return run


def _pipeline_evals(device, tmp_path) -> None:
    from agentic_rl.pipeline import PipelineConfig, _evaluate, run_pipeline

    evals = [EvalConfig(rollout=RolloutConfig(**({"device": device} if device else {})))]
    if device == "cuda":  # the whole pipeline: its device check runs before the first stage is spawned
        run_pipeline(PipelineConfig(model="tiny-qwen3", output_dir=str(tmp_path / "run"), evals=evals))
    _evaluate("tiny-qwen3", evals, print)


def _rm_sampled_pairs(device, tmp_path) -> None:
    from agentic_rl.training.reward_model import PairsConfig, _sampled_pairs

    rollout = RolloutConfig(**({"device": device} if device else {}))
    _sampled_pairs(PairsConfig(source="sampled", policy="tiny-qwen3", rollout=rollout), [], seed=0)


def _trl_backend(device, tmp_path) -> None:
    from agentic_rl.integrations.trl_backend import build_trl_trainer
    from agentic_rl.models.policy import ModelConfig
    from agentic_rl.training.grpo_config import GRPOConfig, GRPORolloutConfig
    from agentic_rl.training.loop import LoopConfig

    rollout = GRPORolloutConfig(batch_size=2, group_size=2, **({"device": device} if device else {}))
    build_trl_trainer(
        GRPOConfig(
            backend="trl",
            model=ModelConfig(name="tiny-qwen3"),
            rollout=rollout,
            micro_batch_size=2,
            train=LoopConfig(steps=1, output_dir=str(tmp_path / "trl")),
        )
    )


COMMANDS = {
    "eval": _cli("eval", "--model", "tiny-qwen3", "--env", "arith"),
    "chat": _cli("chat", "--model", "tiny-qwen3"),
    "audit": _cli("audit", "--model", "tiny-qwen3", "--env", "arith"),
    "serve": _cli("serve", "--model", "tiny-qwen3"),
    "pipeline evals": _pipeline_evals,
    "rm sampled pairs": _rm_sampled_pairs,
    "trl backend": _trl_backend,
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("device", [None, "auto", "cpu"])
def test_every_model_loading_command_loads_on_the_resolved_device(command, device, loads, tmp_path):
    """Guards against a command that loads its model on the CPU whatever the machine has (they all
    called load_base_and_tokenizer(name, "float32"), whose device defaulted to "cpu"): the default
    (auto) and an explicit cpu both reach the loader as a resolved torch.device."""
    with pytest.raises(_Loaded):
        COMMANDS[command](device, tmp_path)
    assert loads == [("tiny-qwen3", "float32", torch.device("cpu"))]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_explicit_cuda_without_a_gpu_stops_before_any_model_loads(command, loads, tmp_path, capsys):
    """Guards against a `cuda` setting that fails deep inside a model load (or, in the pipeline,
    after the stages before the first evaluation), or that silently decodes on the CPU."""
    with pytest.raises(ValueError):
        COMMANDS[command]("cuda", tmp_path)
    message = capsys.readouterr().err if command in ("eval", "chat", "audit", "serve") else None
    assert loads == []
    if message is not None:
        assert (
            "rollout.device: device 'cuda' but torch sees no CUDA device (torch.cuda.is_available() is False); "
            "set device: cpu or auto" in message
        )


def test_the_cuda_message_names_the_setting_and_the_fix(monkeypatch):
    """Guards against device: cuda on a machine without CUDA failing inside torch: the message names the config
    key and suggests cpu or auto."""
    from agentic_rl.models.device import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError) as caught:
        resolve_device("cuda", "evals[0].rollout.device")
    assert str(caught.value) == (
        "evals[0].rollout.device: device 'cuda' but torch sees no CUDA device "
        "(torch.cuda.is_available() is False); set device: cpu or auto"
    )


def test_auto_is_the_gpu_when_torch_sees_one(monkeypatch):
    """Guards against `auto` meaning the CPU on a GPU machine (the reason this setting exists)."""
    from agentic_rl.models.device import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(ValueError, match=r"rollout.device: device 'cuda:2' but torch sees 2 CUDA device\(s\)"):
        resolve_device("cuda:2")


@pytest.mark.parametrize("value", ["cuda:x", "gpu", "cuda:-1", "CPU", "cuda:0,1"])
def test_a_malformed_device_is_rejected_naming_the_key(value, tmp_path, capsys):
    """Guards against a typo that passes validation and fails (or is ignored) at load time: the
    config's `DeviceSetting` marker refuses it wherever a rollout section is built, naming the key."""
    with pytest.raises(ValueError, match=r"RolloutConfig: 'device' must be auto, cpu, cuda or cuda:N"):
        RolloutConfig(device=value)
    config = tmp_path / "pipeline.yaml"
    config.write_text(f"model: tiny-qwen3\nevals:\n  - rollout: {{device: '{value}'}}\n")
    from agentic_rl.pipeline import PipelineConfig

    with pytest.raises(ValueError, match=r"'evals\[0\]\.rollout\.device' must be auto, cpu"):
        load_config(PipelineConfig, config)
    assert main(["eval", "--model", "tiny-qwen3", "--device", value]) == 2
    assert (
        f"'rollout.device' must be auto, cpu, cuda or cuda:N (N a GPU index, e.g. cuda:1), got {value!r}"
        in capsys.readouterr().err
    )


def test_settings_that_would_be_ignored_are_rejected():
    """Guards against a device the run would not use: our trainers decode on accelerate's device,
    TRL places one GPU per process, and a pipeline stage's evaluations share one loaded model."""
    from agentic_rl.pipeline import PipelineConfig
    from agentic_rl.training.grpo_config import GRPOConfig
    from agentic_rl.training.ppo_config import PPOConfig

    for command, cls in (("grpo", GRPOConfig), ("ppo", PPOConfig)):
        with pytest.raises(ValueError, match="rollout.device=cpu: the trainer decodes with the model it trains"):
            load_config(cls, overrides=["rollout.device=cpu"])
    with pytest.raises(ValueError, match=r"rollout.device=cuda:1: TRL puts the model on accelerate's device"):
        from agentic_rl.integrations.trl_backend import _check_unmappable

        _check_unmappable(load_config(GRPOConfig, overrides=["backend=trl", "rollout.device=cuda:1"]))
    with pytest.raises(ValueError, match=r"evals\[\]\.rollout\.device: .* one device, got \['auto', 'cpu'\]"):
        PipelineConfig(evals=[EvalConfig(), EvalConfig(rollout=RolloutConfig(device="cpu"))])
