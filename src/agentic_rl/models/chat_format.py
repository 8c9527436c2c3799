"""How a conversation becomes tokens for one tokenizer: prompts, observations and stop rules.

The rollout engine is token-in-token-out (DESIGN.md invariant 1): the policy's own tokens are
kept as sampled and never re-tokenized. Only the prompt and the observations are rendered, and
they are rendered *incrementally*, by the tokenizer's own chat template:

    prompt_ids(messages, tools)      the template with add_generation_prompt=True
    observation_ids(before, turn, obs)
                                     the tokens that follow the policy's last generated token,
                                     through the next assistant generation prompt

`observation_ids` renders the conversation with and without the new messages and takes the
text delta that starts right after the assistant turn's content, then tokenizes that delta.
The assistant content is rendered as an opaque placeholder (never the model's text), so the
delta does not depend on how the template would rewrite the model's words, and the rendered
prefix is checked to be preserved (else `ChatFormatError`).

End-of-turn bookkeeping (which tokens get loss mask 1):

    turn stopped at <|im_end|> (generated, mask 1):
        ... A A A <|im_end|> | \\n <|im_start|>user\\n<tool_response>...<|im_end|>\\n<|im_start|>assistant\\n
                             ^ observation starts after the generated marker
    turn stopped at </tool_call> (or at a token limit), no <|im_end|> generated:
        ... A A </tool_call> | <|im_end|>\\n<|im_start|>user\\n<tool_response>...<|im_start|>assistant\\n
                             ^ the observation starts with the end-of-turn marker, mask 0:
                               the policy never sampled it, so it is never trained

Either way the token sequence equals the template's rendering of the same conversation; only
the owner of the `<|im_end|>` token differs. Every observation starts either with a special
token or right after one, and special tokens are hard boundaries of the tokenizer, so
tokenizing the delta alone gives the same ids as tokenizing the whole rendering.

Where a full re-render of the conversation is NOT token-identical to the episode (documented,
and shown in tests/test_chat_format.py):
  * Qwen3 drops the `<think>` blocks of assistant turns that precede the last real user message
    (a feedback observation with role "user" is such a message; tool responses are not).
  * Qwen3 renders the *last* assistant message of a conversation with an injected empty
    `<think>\\n\\n</think>\\n\\n` block, which the model never generated.
  * A template renders `<|im_end|>\\n` after the final assistant message; an episode that ends
    on a generated `<|im_end|>` has no trailing newline.
These affect re-rendering only. The engine never re-renders earlier turns, so its prefixes are
always exactly what the policy saw.

Tools for templates without tool support (SmolLM2's plain ChatML; detected by the absence of
"tools" in the template source), one fixed rendering that SFT teaches:
  * the tool schemas are appended to the system message in Hermes style, the same text Qwen3's
    template writes (`# Tools ... <tools>{json}</tools> ... <tool_call>` instructions);
    a system message is created if the conversation has none;
  * consecutive tool results become ONE user turn whose content is the blocks
    `<tool_response>\\n{content}\\n</tool_response>` joined by "\\n" (again as Qwen3 renders them).
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from transformers import PreTrainedTokenizerBase

from agentic_rl.tools.parse import TOOL_CALL_CLOSE

Message = dict[str, Any]

# An opaque stand-in for assistant content when deriving observation deltas. It contains no
# "</think>" and no special markers, so no template rewrites it.
_ASSISTANT_PLACEHOLDER = "\u2983ASSISTANT-TURN-{index}\u2984"

_HERMES_TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_HERMES_TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


class ChatFormatError(ValueError):
    """The chat template does not render conversations incrementally the way the engine needs."""


class ChatFormat:
    """Renders prompts and observations to token ids for one tokenizer (see module docstring)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, end_of_turn: str = "<|im_end|>") -> None:
        if tokenizer.chat_template is None:
            raise ChatFormatError("the tokenizer has no chat template; ChatFormat needs one to render turns")
        self.tokenizer = tokenizer
        self.end_of_turn = end_of_turn
        """The text the template writes after an assistant turn's content (ChatML: <|im_end|>)."""
        end_ids = tokenizer.convert_tokens_to_ids([end_of_turn])
        if end_ids[0] is None or end_ids[0] == tokenizer.unk_token_id:
            raise ChatFormatError(f"end-of-turn marker {end_of_turn!r} is not a single token of this tokenizer")
        self.end_of_turn_id: int = end_ids[0]
        stop = {self.end_of_turn_id}
        if tokenizer.eos_token_id is not None:
            stop.add(tokenizer.eos_token_id)
        self.stop_token_ids: frozenset[int] = frozenset(stop)
        """Token ids that end a policy turn (the end-of-turn marker and the tokenizer's eos)."""
        self.tool_call_end: str = TOOL_CALL_CLOSE
        """Text that also ends a turn. One special token in Qwen3 (151658), five in SmolLM2."""
        self.supports_tools: bool = "tools" in str(tokenizer.chat_template)
        """True when the template renders `tools=` and role "tool" itself (Qwen3); else Hermes injection."""
        self._check_end_of_turn_follows_assistant()

    @classmethod
    def for_tokenizer(cls, tokenizer: PreTrainedTokenizerBase) -> "ChatFormat":
        return cls(tokenizer)

    # ------------------------------------------------------------------ rendering

    def render(
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None = None, add_generation_prompt: bool = False
    ) -> str:
        """The template's text for `messages` (tool messages and schemas adapted for ChatML-only templates)."""
        messages = [dict(m) for m in messages]
        tools = list(tools) if tools else None
        if not self.supports_tools:
            messages = _inject_tools_hermes(_tool_messages_as_user(messages), tools)
            tools = None
        return self.tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False
        )

    def encode(self, text: str) -> list[int]:
        """Tokenize rendered template text (no BOS/EOS added: the template wrote every marker)."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt_ids(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None = None) -> list[int]:
        """The episode's prompt: `messages` rendered with the assistant generation prompt."""
        return self.encode(self.render(messages, tools, add_generation_prompt=True))

    def observation_ids(
        self,
        messages_before: Sequence[Message],
        assistant_text: str,
        observation_messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> list[int]:
        """Tokens after the policy's last generated token, through the next generation prompt.

        messages_before: the conversation before the policy turn (ends with the user/observation
            that the generation prompt followed).
        assistant_text: the decoded policy turn, special tokens kept. If it ends with the
            end-of-turn marker (the policy generated `<|im_end|>`), the delta starts after it;
            otherwise the delta starts with the marker (mask 0, see module docstring).
        observation_messages: the env's observation (role "tool" or "user" messages), non-empty.
        """
        if not observation_messages:
            raise ValueError("observation_messages is empty: an observation needs at least one message")
        history = _with_placeholder_assistants(messages_before)
        placeholder = _ASSISTANT_PLACEHOLDER.format(index="current")
        before = self.render(history, tools, add_generation_prompt=True)
        after = self.render(
            [*history, {"role": "assistant", "content": placeholder}, *observation_messages],
            tools,
            add_generation_prompt=True,
        )
        if not after.startswith(before + placeholder):
            raise ChatFormatError(
                "the chat template does not preserve the rendered prefix when an assistant turn and an "
                "observation are appended, so observations cannot be rendered incrementally. Prefix:\n"
                f"{before[-200:]!r}\nre-rendered:\n{after[max(0, len(before) - 200):len(before) + 60]!r}"
            )
        delta = after[len(before) + len(placeholder):]
        if not delta.startswith(self.end_of_turn):
            raise ChatFormatError(f"expected the template to close the assistant turn with {self.end_of_turn!r}, got {delta[:40]!r}")
        if assistant_text.endswith(self.end_of_turn):
            delta = delta[len(self.end_of_turn):]  # the policy generated (and owns) the marker
        return self.encode(delta)

    # ------------------------------------------------------------------ stop detection

    def ends_turn(self, turn_ids: Sequence[int]) -> bool:
        """True when the last token of `turn_ids` ends the turn: a stop token, or it completes `</tool_call>`.

        Decodes a short tail of the turn for stop detection only (never for training). The
        turn stops at the first `</tool_call>`, so one found in the tail is always new.
        """
        if not turn_ids:
            return False
        if turn_ids[-1] in self.stop_token_ids:
            return True
        tail = self.tokenizer.decode(list(turn_ids[-16:]), skip_special_tokens=False)
        return self.tool_call_end in tail

    def decode_turn(self, turn_ids: Sequence[int]) -> str:
        """The turn's text with special tokens kept (for env.step, messages and logs)."""
        return self.tokenizer.decode(list(turn_ids), skip_special_tokens=False)

    def _check_end_of_turn_follows_assistant(self) -> None:
        probe = [{"role": "user", "content": "q"}, {"role": "assistant", "content": _ASSISTANT_PLACEHOLDER.format(index=0)}]
        text = self.render(probe)
        marker_at = text.find(_ASSISTANT_PLACEHOLDER.format(index=0)) + len(_ASSISTANT_PLACEHOLDER.format(index=0))
        if not text[marker_at:].startswith(self.end_of_turn):
            raise ChatFormatError(
                f"this template does not end assistant turns with {self.end_of_turn!r}; pass the right "
                "end_of_turn to ChatFormat (only ChatML-style templates are supported today)"
            )


def _with_placeholder_assistants(messages: Sequence[Message]) -> list[Message]:
    """Replace earlier assistant contents by opaque placeholders.

    The delta after a new turn is structural; it must not depend on how a template rewrites
    earlier model text (Qwen3 drops `<think>` before the last user query). Using the model's
    text here would make the prefix check fail on a re-render the engine never does.
    """
    out = []
    for index, message in enumerate(messages):
        if message.get("role") == "assistant":
            message = {"role": "assistant", "content": _ASSISTANT_PLACEHOLDER.format(index=index)}
        out.append(message)
    return out


def _tool_messages_as_user(messages: list[Message]) -> list[Message]:
    """Merge each run of consecutive role "tool" messages into one user turn of <tool_response> blocks."""
    out: list[Message] = []
    for message in messages:
        if message.get("role") != "tool":
            out.append(message)
            continue
        block = f"<tool_response>\n{message['content']}\n</tool_response>"
        if out and out[-1].get("_tool_turn"):
            out[-1]["content"] += "\n" + block
        else:
            out.append({"role": "user", "content": block, "_tool_turn": True})
    return [{k: v for k, v in m.items() if k != "_tool_turn"} for m in out]


def _inject_tools_hermes(messages: list[Message], tools: list[dict[str, Any]] | None) -> list[Message]:
    """Append the Hermes tool block to the system message (creating one if needed)."""
    if not tools:
        return messages
    block = _HERMES_TOOLS_HEADER + "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools) + _HERMES_TOOLS_FOOTER
    if messages and messages[0].get("role") == "system":
        return [{"role": "system", "content": messages[0]["content"] + "\n\n" + block}, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]
