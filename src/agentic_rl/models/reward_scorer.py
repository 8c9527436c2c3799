"""The reward-model scorer: a sequence classifier's score at each row's last real token, and the
folder `agentic-rl rm` leaves (classifier weights or LoRA adapters, tokenizer, `agentic_rl_rm.json`).

    classifier, tokenizer, base = load_reward_model(ModelConfig(name="runs/demo/sft/final"))
    scores = RewardScorer(classifier)(input_ids, attention_mask)        # (B,)
    save_reward_model(classifier, tokenizer, "runs/rm/final", base)
    scorer, tokenizer = load_trained_reward_model("runs/rm/final")       # for the reward term
    critic, tokenizer, score = load_reward_backbone("runs/rm/final", ModelConfig())   # PPO's critic

The score is pooled by the attention mask, not by searching for pad ids: SmolLM2's pad id is its
end-of-turn id, which every trajectory contains.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel
from transformers import AutoModelForSequenceClassification, AutoTokenizer, Qwen3ForSequenceClassification

from agentic_rl.models.backbone import backbone_hidden, backbone_of, shared_prefix_length, unwrap_causal_lm
from agentic_rl.models.loader import BUILTIN_MODELS, TINY_QWEN3, build_tiny_qwen3, load_tokenizer, resolve_model_path
from agentic_rl.models.lora import apply_lora, describe_trainable, quiet_peft
from agentic_rl.models.policy import ModelConfig, make_trainable
from agentic_rl.models.stage_output import DTYPES, load_base_and_tokenizer
from agentic_rl.strict_json import read_json, write_json

RM_RECORD = "agentic_rl_rm.json"


class RewardScorer(torch.nn.Module):
    """Sequence-classification model -> (B,) scores at each row's last real token."""

    def __init__(self, classifier: torch.nn.Module):
        super().__init__()
        self.classifier = classifier

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        backbone = backbone_of(self.classifier)
        last = attention_mask.long().cumsum(-1).argmax(-1)  # (B,): index of the last real token (right padding)
        rows = torch.arange(input_ids.shape[0], device=input_ids.device)
        pooled_at = torch.zeros_like(input_ids)
        pooled_at[rows, last] = 1  # (B, T): shared_prefix_length keeps P before every pooled position
        prefix = shared_prefix_length(input_ids, attention_mask, pooled_at)
        hidden = backbone_hidden(backbone, input_ids, attention_mask, prefix)  # (B, T-P, H)
        pooled = hidden[rows, last - prefix]  # (B, H)
        return unwrap_causal_lm(self.classifier).score(pooled).squeeze(-1).float()  # (B,)


def load_reward_model(cfg: ModelConfig, device: Any = "cpu", log=print):
    """(classifier with LoRA per cfg, tokenizer, base name)."""
    classifier, tokenizer = base_classifier(cfg.name, cfg.dtype, device)
    classifier = apply_lora(classifier, cfg.lora, task_type="SEQ_CLS").to(device)
    if not cfg.lora.enabled:
        classifier.requires_grad_(True)
    log(describe_trainable(classifier))
    return classifier, tokenizer, cfg.name


def base_classifier(name: str, dtype: str = "float32", device: Any = "cpu"):
    """(a sequence classifier with a fresh Linear(H, 1) score head and no adapters, tokenizer) on the
    model `name`: a built-in name, a model directory, a hub id, or a previous stage's LoRA folder
    (merged first)."""
    if name == TINY_QWEN3:
        config = build_tiny_qwen3().config
        config.num_labels = 1
        torch.manual_seed(0)
        classifier, tokenizer = Qwen3ForSequenceClassification(config).to(DTYPES[dtype]), load_tokenizer(TINY_QWEN3)
    elif (Path(name) / "config.json").exists() or name in BUILTIN_MODELS or "/" in name and not Path(name).exists():
        tokenizer = load_tokenizer(name)
        classifier = AutoModelForSequenceClassification.from_pretrained(
            resolve_model_path(name), num_labels=1, dtype=DTYPES[dtype]
        )
    else:  # a previous stage's LoRA folder: merge it, then add a score head
        base_model, tokenizer, _ = load_base_and_tokenizer(name, dtype, device)
        with tempfile.TemporaryDirectory() as staging:
            base_model.save_pretrained(staging)
            classifier = AutoModelForSequenceClassification.from_pretrained(staging, num_labels=1, dtype=DTYPES[dtype])
    classifier.config.pad_token_id = tokenizer.pad_token_id
    return classifier.to(device), tokenizer


def save_reward_model(classifier: torch.nn.Module, tokenizer: Any, folder: str | Path, base: str) -> None:
    """Write a trained reward model: weights (or adapters), tokenizer, and its record."""
    classifier.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    write_json(Path(folder) / RM_RECORD, {"base": base, "lora": hasattr(classifier, "peft_config")})


def load_trained_reward_model(folder: str | Path, device: Any = "cpu") -> tuple[RewardScorer, Any]:
    """(scorer in eval mode, tokenizer) from a folder `save_reward_model` wrote."""
    folder = Path(folder)
    if not is_reward_model_folder(folder):
        raise ValueError(f"{folder} is not a reward model from `agentic-rl rm` (no {RM_RECORD})")
    meta = read_json(folder / RM_RECORD, "restore it, or train the reward model again with `agentic-rl rm`")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if meta.get("lora"):  # the base from the record, through our loader: the adapters' own base path is
        # null for tiny-qwen3, and for SmolLM2 a cache directory of the machine that trained
        if not meta.get("base"):
            raise ValueError(
                f"{folder / RM_RECORD} has no 'base' (the model its adapters sit on); train it again with `agentic-rl rm`"
            )
        classifier, _ = base_classifier(meta["base"], "float32", device)
        with quiet_peft():
            classifier = PeftModel.from_pretrained(classifier, folder).merge_and_unload()
    else:
        classifier = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=1)
    return RewardScorer(classifier.eval().to(device)), tokenizer


def is_reward_model_folder(path: str | Path) -> bool:
    """Whether `path` is a folder `save_reward_model` wrote."""
    return (Path(path) / RM_RECORD).exists()


def load_reward_backbone(folder: str | Path, cfg: ModelConfig, device: Any = "cpu", log=print):
    """(decoder with fresh LoRA per cfg.lora, tokenizer, score weight (1, H)): a trained reward
    model as the start of PPO's separate critic. The RM's own adapters are merged first; its
    score head is returned, not wrapped, so the critic's value head can start from it: the
    critic's first V(s) is the RM's score of the conversation up to s. cfg.name is ignored (the
    folder is the model); cfg.dtype, cfg.lora and cfg.gradient_checkpointing apply."""
    scorer, tokenizer = load_trained_reward_model(folder, device)
    classifier = scorer.classifier
    score = classifier.score
    if score.bias is not None or score.out_features != 1:
        raise ValueError(
            f"{folder}: the reward model's score head is {score}; a critic starts from a bias-free "
            "Linear(hidden, 1), as `agentic-rl rm` trains"
        )
    weight = score.weight.detach().clone().float()  # (1, H)
    critic = make_trainable(backbone_of(classifier).to(DTYPES[cfg.dtype]), cfg, "FEATURE_EXTRACTION", log)
    return critic, tokenizer, weight
