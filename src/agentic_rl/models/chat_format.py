"""How a conversation becomes tokens for one tokenizer: prompts, observations and stop rules.

The rollout engine is token-in-token-out (docs/design.md invariant 1): the policy's own tokens are
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
tokenizing the delta alone gives the same ids as tokenizing the whole rendering (`render_ids`).

Message contents are data, never control tokens (models/data_tokens.py): the content of every
message but the policy's own (system, user, tool: the env's prompt, tool output, a serve client's
text), a message's name and the tool schemas' strings are encoded as plain text, so a tool result
that prints `<|im_end|>\n<|im_start|>assistant` (or Qwen3's `</tool_response>`, `<think>`) cannot
forge a turn boundary. An assistant content (a demonstration's turn, a serve client's history, a
context's earlier turns) keeps only the policy's own markers: `<think>`, `</think>`, `<tool_call>`,
`</tool_call>` where they are added tokens (Qwen3); the arguments inside a call are plain text.
Only the template's own text gives every control token. To know which text is which, each value is
rendered as a sentinel and put back, and the result is checked to be the template's own rendering
of the real values (else `ChatFormatError`: a template that rewrites contents). For values without
control strings the ids are unchanged.

Where a full re-render of the conversation is NOT token-identical to the episode (documented,
and shown in tests/test_chat_format.py):
  * Qwen3 drops the `<think>` blocks of assistant turns that precede the last real user message
    (a feedback observation with role "user" is such a message; tool responses are not).
  * Qwen3 renders the *last* assistant message of a conversation with an injected empty
    `<think>\\n\\n</think>\\n\\n` block, which the model never generated.
  * A template renders `<|im_end|>\\n` after the final assistant message; an episode that ends
    on a generated `<|im_end|>` has no trailing newline.
  * With enable_thinking=false, Qwen3 writes an empty `<think>\n\n</think>\n\n` after every
    generation prompt, which the policy's turn follows, but drops it from assistant turns it
    re-renders (they have no reasoning). The episode keeps it: the policy saw it.
These affect re-rendering only. The engine never re-renders earlier turns, so its prefixes are
always exactly what the policy saw.

Thinking models (`enable_thinking`, the `rollout.enable_thinking` / `sft.enable_thinking` setting):
None leaves the template's own default (Qwen3: thinking on, the model opens `<think>` itself);
true/false is passed to every rendering as the template variable `enable_thinking`. A template
without that switch refuses a set value (ChatFormatError) rather than ignore it.

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
import re
from typing import Any, Callable, Sequence

from transformers import PreTrainedTokenizerBase

from agentic_rl.models.data_tokens import (
    DATA,
    POLICY,
    STRUCTURE,
    DataSafeEncoder,
    DataTokensError,
    Kind,
    Piece,
    drop_prefix,
)
from agentic_rl.tools.parse import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

Message = dict[str, Any]

# An opaque stand-in for assistant content when deriving observation deltas. It contains no
# "</think>" and no special markers, so no template rewrites it.
_ASSISTANT_PLACEHOLDER = "\u2983ASSISTANT-TURN-{index}\u2984"

# Where a value from outside the template is in the rendering (see `render_pieces`).
_SENTINEL = "\u2983VALUE-{index}\u2984"
_SENTINEL_PATTERN = re.compile("\u2983VALUE-[0-9]+\u2984")
_TOOL_RESPONSE_OPEN, _TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"

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

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, end_of_turn: str = "<|im_end|>", enable_thinking: bool | None = None
    ) -> None:
        if tokenizer.chat_template is None:
            raise ChatFormatError("the tokenizer has no chat template; ChatFormat needs one to render turns")
        if enable_thinking is not None and "enable_thinking" not in str(tokenizer.chat_template):
            raise ChatFormatError(
                f"enable_thinking={str(enable_thinking).lower()}, but this tokenizer's chat template has no "
                "enable_thinking switch, so the setting would be ignored; leave enable_thinking unset (null)"
            )
        self.tokenizer = tokenizer
        self.enable_thinking = enable_thinking
        """The template's `enable_thinking` variable (None: not passed, the template's default)."""
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
        self._splits_reasoning = "reasoning_content" in str(tokenizer.chat_template)
        try:
            self.data_encoder = DataSafeEncoder(
                tokenizer, policy_tokens=(_THINK_OPEN, _THINK_CLOSE), call=(TOOL_CALL_OPEN, TOOL_CALL_CLOSE)
            )
            """Encodes rendered pieces so message contents never become control tokens."""
        except DataTokensError as exc:
            raise ChatFormatError(str(exc)) from None
        self._check_end_of_turn_follows_assistant()
        self.generation_suffix: str = self._generation_suffix()
        """Text this setting adds to a generation prompt that the template drops when it re-renders
        the turn (Qwen3, enable_thinking=false: the empty think block); "" otherwise."""

    @classmethod
    def for_tokenizer(cls, tokenizer: PreTrainedTokenizerBase, enable_thinking: bool | None = None) -> "ChatFormat":
        return cls(tokenizer, enable_thinking=enable_thinking)

    # ------------------------------------------------------------------ rendering

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
    ) -> str:
        """The template's text for `messages` (tool messages and schemas adapted for ChatML-only templates)."""
        messages = [dict(m) for m in messages]
        tools = list(tools) if tools else None
        if not self.supports_tools:
            messages = _inject_tools_hermes(_tool_messages_as_user(messages), tools)
            tools = None
        options = {} if self.enable_thinking is None else {"enable_thinking": self.enable_thinking}
        return self.tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False, **options
        )

    def render_pieces(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
    ) -> list[Piece]:
        """`render`'s text as pieces (models/data_tokens.py): what comes from outside the template is
        DATA (contents, names, tool-schema strings) or POLICY (assistant contents); the rest is STRUCTURE.

        Each such value is rendered as a sentinel and put back; the joined pieces are checked to equal
        the template's rendering of the real values, so a template that rewrites or tests a value in a
        way the sentinel hides is refused (ChatFormatError), never encoded wrongly."""
        values: dict[str, tuple[Piece, str, str]] = {}  # sentinel -> (its piece, the head and tail kept around it)

        def mark(text: str, kind: Kind, written: str | None = None, head: str = "", tail: str = "") -> str:
            sentinel = _SENTINEL.format(index=len(values))
            values[sentinel] = ((text if written is None else written, kind), head, tail)
            return head + sentinel + tail

        marked = [self._marked_message(message, mark) for message in messages]
        text = self.render(
            marked,
            _marked_tools(tools, mark, self.data_encoder.holds_control) if tools else tools,
            add_generation_prompt,
        )
        pieces: list[Piece] = []
        at = 0
        for match in _SENTINEL_PATTERN.finditer(text):
            piece, head, tail = values[match.group()]
            start, end = match.start() - len(head), match.end() + len(tail)
            if start < at or text[start : match.start()] != head or text[match.end() : end] != tail:
                raise ChatFormatError(
                    "the chat template split a message content from its <tool_response> ends; contents "
                    "cannot be kept apart from its control tokens"
                )
            pieces += [(text[at:start], STRUCTURE), piece]
            at = end
        pieces.append((text[at:], STRUCTURE))
        if "".join(piece for piece, _ in pieces) != self.render(messages, tools, add_generation_prompt):
            raise ChatFormatError(
                "the chat template rewrites message contents (it does not write each one as it is), so "
                "contents cannot be kept apart from its control tokens; only such templates are supported"
            )
        return [piece for piece in pieces if piece[0]]

    def _marked_message(self, message: Message, mark: Callable[..., str]) -> Message:
        """`message` with its content and name as sentinels (`render_pieces`). Qwen3's template tests
        whether a user content starts with "<tool_response>" and ends with "</tool_response>" (a tool
        turn, not a query), so a data sentinel keeps those ends; it splits an assistant content at
        `</think>` into reasoning and answer, so such a content is split here the same way."""
        out = dict(message)
        if isinstance(message.get("name"), str) and message["name"]:
            out["name"] = mark(message["name"], DATA)
        content = message.get("content")
        if not isinstance(content, str) or not content:
            return out
        if message.get("role") != "assistant":
            head = _TOOL_RESPONSE_OPEN if content.startswith(_TOOL_RESPONSE_OPEN) else ""
            tail = _TOOL_RESPONSE_CLOSE if content.endswith(_TOOL_RESPONSE_CLOSE) else ""
            out["content"] = mark(content, DATA, head=head, tail=tail)
        elif self._splits_reasoning and _THINK_CLOSE in content and "reasoning_content" not in message:
            reasoning = content.split(_THINK_CLOSE)[0].rstrip("\n").split(_THINK_OPEN)[-1].strip("\n")
            answer = content.split(_THINK_CLOSE)[-1].lstrip("\n")
            out["reasoning_content"] = mark(reasoning, POLICY) if reasoning else ""
            out["content"] = mark(answer, POLICY) if answer else ""
        else:
            out["content"] = mark(content, POLICY)
        return out

    def render_ids(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
    ) -> list[int]:
        """The whole conversation as token ids, contents as data: what the engine's incremental ids add up to."""
        return self.data_encoder.encode(self.render_pieces(messages, tools, add_generation_prompt))

    def encode(self, text: str) -> list[int]:
        """Tokenize the template's own text (every added-token string a control token; no BOS/EOS added).
        Never for text from outside: an assistant turn goes through `policy_ids`, contents through
        `render_ids`/`observation_ids`."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def policy_ids(self, text: str) -> list[int]:
        """An assistant turn's text as the policy's tokens: its think and tool-call markers are control
        tokens, anything else (a demonstration's `<|im_end|>`, a call's arguments) plain text."""
        return self.data_encoder.encode([(text, POLICY)])

    def prompt_ids(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None = None) -> list[int]:
        """The episode's prompt: `messages` rendered with the assistant generation prompt, contents as data."""
        return self.render_ids(messages, tools, add_generation_prompt=True)

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
        history = with_placeholder_assistants(messages_before)
        placeholder = _ASSISTANT_PLACEHOLDER.format(index="current")
        before = self.render(history, tools, add_generation_prompt=True)
        after_pieces = self.render_pieces(
            [*history, {"role": "assistant", "content": placeholder}, *observation_messages],
            tools,
            add_generation_prompt=True,
        )
        after = "".join(text for text, _ in after_pieces)
        # The re-render writes the turn's opening without the generation suffix the policy saw
        # (an empty think block), so the prefix is the prompt less that suffix.
        opened = before.removesuffix(self.generation_suffix) if self.generation_suffix else before
        if not (before.endswith(self.generation_suffix) and after.startswith(opened + placeholder)):
            raise ChatFormatError(
                "the chat template does not preserve the rendered prefix when an assistant turn and an "
                "observation are appended, so observations cannot be rendered incrementally. Prefix:\n"
                f"{before[-200:]!r}\nre-rendered:\n{after[max(0, len(opened) - 200) : len(opened) + 60]!r}"
            )
        start = len(opened) + len(placeholder)
        if not after[start:].startswith(self.end_of_turn):
            raise ChatFormatError(
                f"expected the template to close the assistant turn with {self.end_of_turn!r}, got {after[start : start + 40]!r}"
            )
        if assistant_text.endswith(self.end_of_turn):
            start += len(self.end_of_turn)  # the policy generated (and owns) the marker
        return self.data_encoder.encode(drop_prefix(after_pieces, start))

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

    def _generation_suffix(self) -> str:
        """What this enable_thinking adds to the template's default generation prompt ("" for None
        or where it adds nothing); ChatFormatError where it changes the prompt otherwise."""
        if self.enable_thinking is None:
            return ""
        probe = [{"role": "user", "content": "q"}]
        default = self.tokenizer.apply_chat_template(probe, add_generation_prompt=True, tokenize=False)
        prompt = self.render(probe, add_generation_prompt=True)
        if not prompt.startswith(default):
            raise ChatFormatError(
                f"enable_thinking={str(self.enable_thinking).lower()} rewrites the template's generation "
                f"prompt ({default[-40:]!r} -> {prompt[-40:]!r}) instead of adding to it; not supported"
            )
        return prompt[len(default) :]

    def _check_end_of_turn_follows_assistant(self) -> None:
        probe = [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": _ASSISTANT_PLACEHOLDER.format(index=0)},
        ]
        text = self.render(probe)
        marker_at = text.find(_ASSISTANT_PLACEHOLDER.format(index=0)) + len(_ASSISTANT_PLACEHOLDER.format(index=0))
        if not text[marker_at:].startswith(self.end_of_turn):
            raise ChatFormatError(
                f"this template does not end assistant turns with {self.end_of_turn!r}; pass the right "
                "end_of_turn to ChatFormat (only ChatML-style templates are supported today)"
            )


def with_placeholder_assistants(messages: Sequence[Message]) -> list[Message]:
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


def _marked_tools(
    tools: Sequence[dict[str, Any]], mark: Callable[..., str], holds_control: Callable[[str], bool]
) -> list[Any]:
    """The tool schemas with each key and string that holds a control string (or looks like a sentinel) as a DATA sentinel
    (`render_pieces`), written back as JSON writes it: templates write tool schemas as JSON. Others
    are left as they are (their ids are the same either way), so a template that reads a schema's
    keys still finds them."""

    def walk(value: Any) -> Any:
        if isinstance(value, str):
            outside = holds_control(value) or "\u2983VALUE-" in value  # a control string, or a sentinel look-alike
            return mark(value, DATA, written=json.dumps(value, ensure_ascii=False)[1:-1]) if outside else value
        if isinstance(value, dict):
            return {walk(key): walk(item) for key, item in value.items()}
        if isinstance(value, list):
            return [walk(item) for item in value]
        return value

    return [walk(tool) for tool in tools]


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
    block = (
        _HERMES_TOOLS_HEADER + "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools) + _HERMES_TOOLS_FOOTER
    )
    if messages and messages[0].get("role") == "system":
        return [{"role": "system", "content": messages[0]["content"] + "\n\n" + block}, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]
