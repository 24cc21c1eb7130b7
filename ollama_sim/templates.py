"""The turn markers a model family's chat template wraps messages in, as text to count.

Not the families' full Jinja templates: what a prompt costs around its content — a header and an
end-of-turn marker per message, the tool-result and tool-call wrappers, the tools block, the
generation prompt and the BOS token the tokenizer adds. Those are what the Compressor fits from
``prompt_eval_count`` (palimpsest/compressor/exact_count.py); the content itself is counted by the
model's vocabulary. Every turn starts and ends on a control token (Gemma's closing newline stands
alone between two), so per-turn counts add up exactly to the whole prompt's count.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

CHATML = "chatml"
LLAMA3 = "llama3"
GEMMA4 = "gemma4"


@dataclass(frozen=True)
class ChatTemplate:
    turn_open: str  # "{role}" is the role's name in this template
    turn_close: str
    bos: str = ""  # what the tokenizer puts first (add_bos_token)
    role_names: Mapping[str, str] = field(default_factory=dict)
    tool_result: str = "{content}"  # how a tool result's content sits in its turn
    tool_call: str = "{call}"  # one call's {"name", "arguments"} JSON
    tools_header: str = ""
    tools_footer: str = ""

    def role(self, role: str) -> str:
        return self.role_names.get(role, role)

    def opening(self, role: str) -> str:
        return self.turn_open.format(role=self.role(role))

    def generation_prompt(self) -> str:
        """The open assistant turn a prompt ends with."""
        return self.opening("assistant")


TEMPLATES: dict[str, ChatTemplate] = {
    # Qwen: tool results fold into a user turn wrapped in <tool_response>.
    CHATML: ChatTemplate(
        turn_open="<|im_start|>{role}\n",
        turn_close="<|im_end|>\n",
        role_names={"tool": "user"},
        tool_result="<tool_response>\n{content}\n</tool_response>",
        tool_call="<tool_call>\n{call}\n</tool_call>",
        tools_header="# Tools\n\nFunction signatures you may call, within <tools></tools>:\n<tools>\n",
        tools_footer=(
            '\n</tools>\n\nCall one by answering <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>'
        ),
    ),
    # Llama 3.1–3.3: header ids around the role, tool results in the "ipython" role, BOS first.
    LLAMA3: ChatTemplate(
        turn_open="<|start_header_id|>{role}<|end_header_id|>\n\n",
        turn_close="<|eot_id|>",
        bos="<|begin_of_text|>",
        role_names={"tool": "ipython"},
        tools_header=(
            "Environment: ipython\n\nYou have access to the following functions. "
            "To call a function, respond with JSON for a function call.\n\n"
        ),
    ),
    # Gemma 4: <|turn>role … <turn|>, the assistant called "model", tool calls and results and the
    # declarations in their own control tokens, BOS first.
    GEMMA4: ChatTemplate(
        turn_open="<|turn>{role}\n",
        turn_close="<turn|>\n",
        bos="<bos>",
        role_names={"assistant": "model", "tool": "user"},
        tool_result="<|tool_response>{content}<tool_response|>",
        tool_call="<|tool_call>{call}<tool_call|>",
        tools_header="<|tool>",
        tools_footer="<tool|>",
    ),
}
