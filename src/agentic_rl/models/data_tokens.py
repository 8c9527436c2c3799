"""Message contents are data: encode rendered chat text so that only the template's own markers are control tokens.

    encoder = DataSafeEncoder(tokenizer, policy_tokens=("<think>", "</think>"), call=("<tool_call>", "</tool_call>"))
    encoder.encode([("<|im_start|>user\\n", STRUCTURE), ("hi <|im_end|>", DATA), ("<|im_end|>\\n", STRUCTURE)])

Why: a tokenizer matches its added tokens (`<|im_end|>`, `<|im_start|>`, and Qwen3's `<tool_call>`,
`<tool_response>`, `<think>`, ...) anywhere in a string, before its normalizer, pre-tokenizer and
BPE see the text between them. Tool output that prints `<|im_end|>\\n<|im_start|>assistant\\n`,
tokenized with the rendering, would close the tool turn and forge an assistant turn in what the
policy reads and is trained on (and a serve client or a demonstration file could do the same with
its message contents, tool schemas or tool-call arguments).

How: the rendered text comes as pieces, each of one kind:
  STRUCTURE  the template's own text: every added token in it is a control token;
  POLICY     an assistant turn's text (a demonstration's, a serve client's history): only the
             policy's own markers are control tokens (`policy_tokens`, and the tool-call markers
             `call`), and between a call's opening and closing marker (its JSON) only the
             closing one: a tool call's arguments are data;
  DATA       every other content (prompts, tool output, tool schemas): no control token at all.
Added tokens are matched leftmost-longest as the tokenizer matches them; the text between two
matches, of any kinds, is one run, encoded by the same tokenizer with its added vocabulary removed
(same normalizer, pre-tokenizer and BPE). A run never crosses a control token, exactly as in the
tokenizer's own encoding, so for text without added-token strings in its data the ids equal
`tokenizer(text, add_special_tokens=False)` (tests/test_chat_format.py), and `decode(ids)` gives
the text back in every case.

    structure   <|im_start|>user\\n          \\n<|im_start|>assistant\\n        (its added tokens: control)
    data                         a<|im_end|>b                                (plain text, 5 tokens)
    runs                    "user\\na<|im_end|>b"  "\\n"  "assistant\\n"

Supported: fast tokenizers whose added tokens match as plain strings (no lstrip, rstrip,
single_word or normalized option), as SmolLM2's and Qwen3's do; others are refused at
construction, never encoded approximately.
"""

from __future__ import annotations

import re
from typing import Any, Literal, Sequence

from tokenizers import Tokenizer

Kind = Literal["structure", "policy", "data"]
STRUCTURE: Kind = "structure"
POLICY: Kind = "policy"
DATA: Kind = "data"
Piece = tuple[str, Kind]
"""(text, kind): a run of rendered chat text and which control tokens it may hold (module docstring)."""


class DataTokensError(ValueError):
    """The tokenizer's added tokens cannot be kept out of data exactly."""


def plain_tokenizer(backend: Any) -> Any:
    """`backend` (a `tokenizers.Tokenizer`) without its added vocabulary, post-processor, padding and
    truncation (the backend keeps those of the caller's last batch call): the same model, shared, not
    copied, with the same normalizer, pre-tokenizer and decoder. Built from its parts in microseconds,
    against 1.3 s through to_str/from_str for Qwen3's 151k vocabulary (benchmarks/data_encoder_build.py)."""
    plain = Tokenizer(backend.model)
    plain.normalizer, plain.pre_tokenizer, plain.decoder = backend.normalizer, backend.pre_tokenizer, backend.decoder
    return plain


class DataSafeEncoder:
    """Encodes rendered pieces: control tokens only from structure, data always plain text."""

    def __init__(self, tokenizer: Any, policy_tokens: Sequence[str] = (), call: tuple[str, str] | None = None) -> None:
        if not getattr(tokenizer, "is_fast", False):
            raise DataTokensError(
                f"{type(tokenizer).__name__} is a slow (Python) tokenizer; the chat format needs a fast one "
                "(tokenizer.json) to keep control strings in observations as plain text. Load it with use_fast=True"
            )
        self._added_ids: dict[str, int] = {}
        for token_id, token in tokenizer.added_tokens_decoder.items():
            if token.lstrip or token.rstrip or token.single_word or token.normalized:
                raise DataTokensError(
                    f"added token {token.content!r} (id {token_id}) matches with lstrip/rstrip/single_word/normalized "
                    "options, which this encoder does not reproduce; only tokenizers whose added tokens match as plain "
                    "strings (SmolLM2, Qwen3) are supported"
                )
            self._added_ids[token.content] = token_id
        self.control_ids: frozenset[int] = frozenset(self._added_ids.values())
        """Every added token id: the ids that data never produces."""
        self._pattern = _alternation(self._added_ids)
        policy = [token for token in [*policy_tokens, *(call or ())] if token in self._added_ids]
        self._policy_pattern = _alternation(policy)
        self._call = call if call and all(token in self._added_ids for token in call) else None
        self._plain = plain_tokenizer(tokenizer.backend_tokenizer)

    def plain_ids(self, text: str) -> list[int]:
        """`text` as plain text: normalizer, pre-tokenizer and BPE, never an added token."""
        return list(self._plain.encode(text, add_special_tokens=False).ids) if text else []

    def holds_control(self, text: str) -> bool:
        """Whether `text` holds an added token's string (as structure it would give a control token)."""
        return bool(self._pattern and self._pattern.search(text))

    def encode(self, pieces: Sequence[Piece]) -> list[int]:
        """Token ids of the concatenated pieces; added tokens matched as each piece's kind allows."""
        runs: list[str] = []  # the plain text before each matched control token, then the rest
        controls: list[int] = []
        run: list[str] = []
        for text, kind in pieces:
            at = 0
            for match in self._controls_in(text, kind):
                run.append(text[at : match.start()])
                runs.append("".join(run))
                controls.append(self._added_ids[match.group()])
                run, at = [], match.end()
            run.append(text[at:])
        runs.append("".join(run))
        encoded = self._plain.encode_batch(
            runs, add_special_tokens=False
        )  # one call: the per-call cost dominates short runs
        ids: list[int] = []
        for run_encoding, control in zip(encoded, [*controls, None]):
            ids += run_encoding.ids
            if control is not None:
                ids.append(control)
        return ids

    def _controls_in(self, text: str, kind: Kind) -> list[re.Match[str]]:
        """The control tokens of one piece: all added tokens (structure), the policy's markers outside
        a tool call's body and its closing marker inside (policy), none (data)."""
        if kind == STRUCTURE:
            return list(self._pattern.finditer(text)) if self._pattern else []
        if kind == DATA or self._policy_pattern is None:
            return []
        matches, in_call = [], False
        for match in self._policy_pattern.finditer(text):
            if in_call and match.group() != self._call[1]:  # type: ignore[index]
                continue  # a marker inside a call's arguments is text
            matches.append(match)
            in_call = self._call is not None and match.group() == self._call[0]
        return matches


def _alternation(tokens: Sequence[str]) -> re.Pattern[str] | None:
    """A pattern matching `tokens` leftmost-longest, as the tokenizer matches its added tokens."""
    by_length = sorted(tokens, key=len, reverse=True)
    return re.compile("|".join(map(re.escape, by_length))) if by_length else None


def drop_prefix(pieces: Sequence[Piece], chars: int) -> list[Piece]:
    """The pieces without their first `chars` characters (a piece cut there keeps its kind)."""
    out: list[Piece] = []
    for text, kind in pieces:
        if chars >= len(text):
            chars -= len(text)
            continue
        out.append((text[chars:], kind))
        chars = 0
    return out
