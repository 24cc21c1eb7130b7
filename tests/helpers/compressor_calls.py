"""Compressions and sessions to compress, as the Compressor's tests drive them."""

from __future__ import annotations

import json

from palimpsest.compressor.model_tokenizers import TokenCounter
from palimpsest.v1 import common_pb2
from palimpsest.v1 import compressor_pb2 as pb
from palimpsest.v1 import session_store_pb2 as store_pb

Message = common_pb2.Message
WINDOW = 4096
MODEL = "qwen3.6"
# For the summary's own mechanics on plain prose: no pruning stage first (at these windows the
# 600-character answers of ``turns`` older than the newest turn would be condensed, not summarized).
SUMMARY_ONLY = pb.CompressionSettings(prune_tool_results=False)


def filler(i: int, size: int = 600) -> str:
    words = f"turn {i} discusses the deployment of service-{i} with config key timeout_{i} and path /srv/app{i}.py "
    return (words * (size // len(words) + 1))[:size]


def turns(n: int, size: int = 600) -> list[Message]:
    out = []
    for i in range(n):
        out += [
            Message(role="user", content=f"question {i}: " + filler(i, size // 3)),
            Message(role="assistant", content=filler(i, size)),
        ]
    return out


async def session_with(store, profile, messages) -> str:
    s = (await store.CreateSession(store_pb.CreateSessionRequest(profile_id=profile, model=MODEL))).session
    await store.AppendMessages(store_pb.AppendMessagesRequest(session_id=s.id, messages=messages))
    return s.id


async def compress(compressor, session_id, reason=pb.COMPRESSION_REASON_FORCED, **kw) -> list[pb.CompressionEvent]:
    kw.setdefault("window", WINDOW)
    kw.setdefault("model", MODEL)
    return [e async for e in compressor.Compress(pb.CompressRequest(session_id=session_id, reason=reason, **kw))]


def summary_bodies(ollama_sim, since: int = 0) -> list[dict]:
    """The summarizer's chat requests (the only non-streamed ones) from request ``since`` on."""
    return [b for b in ollama_sim.bodies()[since:] if b.get("stream") is False]


# -- pruning: the cheap stage before a summary ----------------------------------------------------
def tool_turns(n: int, result_chars: int = 3_000, name: str = "read_log") -> list[Message]:
    out = []
    for i in range(n):
        log = "\n".join(
            f"2026-11-30T10:{j % 60:02d}:17Z ERROR worker-{i} 10.0.{j % 255}.7 reset id=0x{i * 7919 + j:08x}"
            for j in range(result_chars // 60)
        )
        call = common_pb2.ToolCall(id=f"c{i}", name=name, arguments_json=json.dumps({"path": f"/var/log/{i}.log"}))
        out += [
            Message(role="user", content=f"read log {i}"),
            Message(role="assistant", tool_calls=[call]),
            Message(role="tool", name=name, tool_call_id=f"c{i}", content=log),
            Message(role="assistant", content=f"log {i} shows resets"),
        ]
    return out


# Content of every kind a context holds (prose, code, JSON, dense logs, CJK, emoji and whitespace runs),
# joined in varied orders by the tests of stored cuts and of the summary input's guess.
PIECES = [
    "The compressor keeps the model's context inside its window; nothing the user said is lost. ",
    "def handler(event):\n    return {'id': 1, 'ok': True}\n",
    json.dumps({"rows": [{"id": i, "v": f"v-{i}"} for i in range(5)]}) + "\n",
    "2026-11-30T10:01:17.003Z ERROR [worker-3] 10.0.4.7:5432 conn reset id=0x0001eaf7\n",
    "上下文窗口必须始终容纳完整的提示。日本語のテキストも数えます。",
    "Deploy done 🎉🚀 ok ✅ \t\t  \n\n",
]


class Watched:
    """A counter that says which texts its tokenizer was asked for."""

    def __init__(self, tokenizer):
        self.inner = TokenCounter(tokenizer, "watched")
        self.counted: list[str] = []
        self.cut: list[str] = []

    def counts(self, texts, *, for_cut=False):
        self.counted.extend(texts)
        return self.inner.counts(texts, for_cut=for_cut)

    def head_and_tail(self, text, head, tail):
        self.cut.append(text)
        return self.inner.head_and_tail(text, head, tail)
