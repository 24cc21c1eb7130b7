import datetime

from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ToolCall(_message.Message):
    __slots__ = ("id", "name", "arguments_json")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    arguments_json: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., arguments_json: _Optional[str] = ...) -> None: ...

class SeqRange(_message.Message):
    __slots__ = ("first", "last")
    FIRST_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    first: int
    last: int
    def __init__(self, first: _Optional[int] = ..., last: _Optional[int] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("seq", "role", "content", "thinking", "tool_calls", "tool_call_id", "name", "images", "files", "metadata", "is_context", "is_display", "is_plan", "is_compression", "is_summary", "is_compression_critical", "is_recall", "elapsed_seconds", "tool_call_count", "token_count", "created_at", "breadcrumbs", "replaces", "archived", "explicit_flags", "sliced_from_chars")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    THINKING_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    IS_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    IS_DISPLAY_FIELD_NUMBER: _ClassVar[int]
    IS_PLAN_FIELD_NUMBER: _ClassVar[int]
    IS_COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    IS_SUMMARY_FIELD_NUMBER: _ClassVar[int]
    IS_COMPRESSION_CRITICAL_FIELD_NUMBER: _ClassVar[int]
    IS_RECALL_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_COUNT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    BREADCRUMBS_FIELD_NUMBER: _ClassVar[int]
    REPLACES_FIELD_NUMBER: _ClassVar[int]
    ARCHIVED_FIELD_NUMBER: _ClassVar[int]
    EXPLICIT_FLAGS_FIELD_NUMBER: _ClassVar[int]
    SLICED_FROM_CHARS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    role: str
    content: str
    thinking: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    tool_call_id: str
    name: str
    images: _containers.RepeatedScalarFieldContainer[bytes]
    files: _containers.RepeatedScalarFieldContainer[str]
    metadata: _struct_pb2.Struct
    is_context: bool
    is_display: bool
    is_plan: bool
    is_compression: bool
    is_summary: bool
    is_compression_critical: bool
    is_recall: bool
    elapsed_seconds: float
    tool_call_count: int
    token_count: int
    created_at: _timestamp_pb2.Timestamp
    breadcrumbs: _containers.RepeatedScalarFieldContainer[str]
    replaces: SeqRange
    archived: bool
    explicit_flags: bool
    sliced_from_chars: int
    def __init__(self, seq: _Optional[int] = ..., role: _Optional[str] = ..., content: _Optional[str] = ..., thinking: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., tool_call_id: _Optional[str] = ..., name: _Optional[str] = ..., images: _Optional[_Iterable[bytes]] = ..., files: _Optional[_Iterable[str]] = ..., metadata: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., is_context: _Optional[bool] = ..., is_display: _Optional[bool] = ..., is_plan: _Optional[bool] = ..., is_compression: _Optional[bool] = ..., is_summary: _Optional[bool] = ..., is_compression_critical: _Optional[bool] = ..., is_recall: _Optional[bool] = ..., elapsed_seconds: _Optional[float] = ..., tool_call_count: _Optional[int] = ..., token_count: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., breadcrumbs: _Optional[_Iterable[str]] = ..., replaces: _Optional[_Union[SeqRange, _Mapping]] = ..., archived: _Optional[bool] = ..., explicit_flags: _Optional[bool] = ..., sliced_from_chars: _Optional[int] = ...) -> None: ...

class ExternalRef(_message.Message):
    __slots__ = ("kind", "uri", "created_by", "read_only", "created_at")
    KIND_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    CREATED_BY_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    kind: str
    uri: str
    created_by: str
    read_only: bool
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, kind: _Optional[str] = ..., uri: _Optional[str] = ..., created_by: _Optional[str] = ..., read_only: _Optional[bool] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Session(_message.Message):
    __slots__ = ("id", "profile_id", "owner", "name", "pinned", "provider", "model", "created_at", "last_active", "context_token_count", "revision", "metadata", "external_refs", "untrusted_ingested", "episode_untrusted", "planning_logs", "display_message_count", "messages", "context", "next_seq", "sandboxed", "memory")
    ID_FIELD_NUMBER: _ClassVar[int]
    PROFILE_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_REFS_FIELD_NUMBER: _ClassVar[int]
    UNTRUSTED_INGESTED_FIELD_NUMBER: _ClassVar[int]
    EPISODE_UNTRUSTED_FIELD_NUMBER: _ClassVar[int]
    PLANNING_LOGS_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_MESSAGE_COUNT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEQ_FIELD_NUMBER: _ClassVar[int]
    SANDBOXED_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    id: str
    profile_id: str
    owner: str
    name: str
    pinned: bool
    provider: str
    model: str
    created_at: _timestamp_pb2.Timestamp
    last_active: _timestamp_pb2.Timestamp
    context_token_count: int
    revision: int
    metadata: _struct_pb2.Struct
    external_refs: _containers.RepeatedCompositeFieldContainer[ExternalRef]
    untrusted_ingested: bool
    episode_untrusted: bool
    planning_logs: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Struct]
    display_message_count: int
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    context: _containers.RepeatedCompositeFieldContainer[Message]
    next_seq: int
    sandboxed: bool
    memory: MemorySnapshot
    def __init__(self, id: _Optional[str] = ..., profile_id: _Optional[str] = ..., owner: _Optional[str] = ..., name: _Optional[str] = ..., pinned: _Optional[bool] = ..., provider: _Optional[str] = ..., model: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_active: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., context_token_count: _Optional[int] = ..., revision: _Optional[int] = ..., metadata: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., external_refs: _Optional[_Iterable[_Union[ExternalRef, _Mapping]]] = ..., untrusted_ingested: _Optional[bool] = ..., episode_untrusted: _Optional[bool] = ..., planning_logs: _Optional[_Iterable[_Union[_struct_pb2.Struct, _Mapping]]] = ..., display_message_count: _Optional[int] = ..., messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ..., context: _Optional[_Iterable[_Union[Message, _Mapping]]] = ..., next_seq: _Optional[int] = ..., sandboxed: _Optional[bool] = ..., memory: _Optional[_Union[MemorySnapshot, _Mapping]] = ...) -> None: ...

class MemorySnapshot(_message.Message):
    __slots__ = ("revision", "entries")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    revision: int
    entries: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, revision: _Optional[int] = ..., entries: _Optional[_Iterable[str]] = ...) -> None: ...

class SessionSummary(_message.Message):
    __slots__ = ("id", "profile_id", "owner", "name", "pinned", "provider", "model", "created_at", "last_active", "display_message_count", "preview", "context_token_count", "revision", "untrusted_ingested")
    ID_FIELD_NUMBER: _ClassVar[int]
    PROFILE_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_MESSAGE_COUNT_FIELD_NUMBER: _ClassVar[int]
    PREVIEW_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    UNTRUSTED_INGESTED_FIELD_NUMBER: _ClassVar[int]
    id: str
    profile_id: str
    owner: str
    name: str
    pinned: bool
    provider: str
    model: str
    created_at: _timestamp_pb2.Timestamp
    last_active: _timestamp_pb2.Timestamp
    display_message_count: int
    preview: str
    context_token_count: int
    revision: int
    untrusted_ingested: bool
    def __init__(self, id: _Optional[str] = ..., profile_id: _Optional[str] = ..., owner: _Optional[str] = ..., name: _Optional[str] = ..., pinned: _Optional[bool] = ..., provider: _Optional[str] = ..., model: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_active: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., display_message_count: _Optional[int] = ..., preview: _Optional[str] = ..., context_token_count: _Optional[int] = ..., revision: _Optional[int] = ..., untrusted_ingested: _Optional[bool] = ...) -> None: ...

class RawChunk(_message.Message):
    __slots__ = ("id", "session_id", "content", "content_hash", "turn_range", "first_at", "last_at", "breadcrumbs", "score", "similarity")
    ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    CONTENT_HASH_FIELD_NUMBER: _ClassVar[int]
    TURN_RANGE_FIELD_NUMBER: _ClassVar[int]
    FIRST_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_AT_FIELD_NUMBER: _ClassVar[int]
    BREADCRUMBS_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    SIMILARITY_FIELD_NUMBER: _ClassVar[int]
    id: int
    session_id: str
    content: str
    content_hash: str
    turn_range: SeqRange
    first_at: _timestamp_pb2.Timestamp
    last_at: _timestamp_pb2.Timestamp
    breadcrumbs: _containers.RepeatedScalarFieldContainer[str]
    score: float
    similarity: float
    def __init__(self, id: _Optional[int] = ..., session_id: _Optional[str] = ..., content: _Optional[str] = ..., content_hash: _Optional[str] = ..., turn_range: _Optional[_Union[SeqRange, _Mapping]] = ..., first_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., breadcrumbs: _Optional[_Iterable[str]] = ..., score: _Optional[float] = ..., similarity: _Optional[float] = ...) -> None: ...

class FileInfo(_message.Message):
    __slots__ = ("name", "path", "size", "sha256", "content_type", "outside_content")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    OUTSIDE_CONTENT_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    size: int
    sha256: str
    content_type: str
    outside_content: bool
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ..., size: _Optional[int] = ..., sha256: _Optional[str] = ..., content_type: _Optional[str] = ..., outside_content: _Optional[bool] = ...) -> None: ...

class TokenCount(_message.Message):
    __slots__ = ("seq", "tokens", "content_md5", "cut")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    CONTENT_MD5_FIELD_NUMBER: _ClassVar[int]
    CUT_FIELD_NUMBER: _ClassVar[int]
    seq: int
    tokens: int
    content_md5: str
    cut: CutCount
    def __init__(self, seq: _Optional[int] = ..., tokens: _Optional[int] = ..., content_md5: _Optional[str] = ..., cut: _Optional[_Union[CutCount, _Mapping]] = ...) -> None: ...

class CutCount(_message.Message):
    __slots__ = ("head_tokens", "tail_tokens", "head_chars", "tail_chars", "tokens", "content_md5")
    HEAD_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TAIL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    HEAD_CHARS_FIELD_NUMBER: _ClassVar[int]
    TAIL_CHARS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    CONTENT_MD5_FIELD_NUMBER: _ClassVar[int]
    head_tokens: int
    tail_tokens: int
    head_chars: int
    tail_chars: int
    tokens: int
    content_md5: str
    def __init__(self, head_tokens: _Optional[int] = ..., tail_tokens: _Optional[int] = ..., head_chars: _Optional[int] = ..., tail_chars: _Optional[int] = ..., tokens: _Optional[int] = ..., content_md5: _Optional[str] = ...) -> None: ...

class PromptShape(_message.Message):
    __slots__ = ("content_tokens", "messages", "tool_results", "tool_calls", "tools", "image_prior_tokens", "images", "chars_space", "chars_digit", "chars_latin", "chars_cjk", "chars_other_letter", "chars_symbol")
    CONTENT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TOOL_RESULTS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    IMAGE_PRIOR_TOKENS_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    CHARS_SPACE_FIELD_NUMBER: _ClassVar[int]
    CHARS_DIGIT_FIELD_NUMBER: _ClassVar[int]
    CHARS_LATIN_FIELD_NUMBER: _ClassVar[int]
    CHARS_CJK_FIELD_NUMBER: _ClassVar[int]
    CHARS_OTHER_LETTER_FIELD_NUMBER: _ClassVar[int]
    CHARS_SYMBOL_FIELD_NUMBER: _ClassVar[int]
    content_tokens: int
    messages: int
    tool_results: int
    tool_calls: int
    tools: int
    image_prior_tokens: int
    images: int
    chars_space: int
    chars_digit: int
    chars_latin: int
    chars_cjk: int
    chars_other_letter: int
    chars_symbol: int
    def __init__(self, content_tokens: _Optional[int] = ..., messages: _Optional[int] = ..., tool_results: _Optional[int] = ..., tool_calls: _Optional[int] = ..., tools: _Optional[int] = ..., image_prior_tokens: _Optional[int] = ..., images: _Optional[int] = ..., chars_space: _Optional[int] = ..., chars_digit: _Optional[int] = ..., chars_latin: _Optional[int] = ..., chars_cjk: _Optional[int] = ..., chars_other_letter: _Optional[int] = ..., chars_symbol: _Optional[int] = ...) -> None: ...
