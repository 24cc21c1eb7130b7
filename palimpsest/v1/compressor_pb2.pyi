from palimpsest.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EstimateMethod(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ESTIMATE_METHOD_UNSPECIFIED: _ClassVar[EstimateMethod]
    ESTIMATE_METHOD_FALLBACK: _ClassVar[EstimateMethod]
    ESTIMATE_METHOD_CALIBRATED: _ClassVar[EstimateMethod]
    ESTIMATE_METHOD_BASELINE_DELTA: _ClassVar[EstimateMethod]
    ESTIMATE_METHOD_EXACT: _ClassVar[EstimateMethod]

class SizeDecision(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SIZE_DECISION_UNSPECIFIED: _ClassVar[SizeDecision]
    SIZE_DECISION_FITS: _ClassVar[SizeDecision]
    SIZE_DECISION_COMPRESS_FIRST: _ClassVar[SizeDecision]
    SIZE_DECISION_TOO_LARGE: _ClassVar[SizeDecision]

class CompressionReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMPRESSION_REASON_UNSPECIFIED: _ClassVar[CompressionReason]
    COMPRESSION_REASON_PRETURN: _ClassVar[CompressionReason]
    COMPRESSION_REASON_MIDTURN: _ClassVar[CompressionReason]
    COMPRESSION_REASON_POSTTURN: _ClassVar[CompressionReason]
    COMPRESSION_REASON_FORCED: _ClassVar[CompressionReason]
    COMPRESSION_REASON_TURN_END: _ClassVar[CompressionReason]

class CompressionMethod(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMPRESSION_METHOD_UNSPECIFIED: _ClassVar[CompressionMethod]
    COMPRESSION_METHOD_SUMMARY: _ClassVar[CompressionMethod]
    COMPRESSION_METHOD_HARD_TRUNCATE: _ClassVar[CompressionMethod]
    COMPRESSION_METHOD_PRUNE: _ClassVar[CompressionMethod]
ESTIMATE_METHOD_UNSPECIFIED: EstimateMethod
ESTIMATE_METHOD_FALLBACK: EstimateMethod
ESTIMATE_METHOD_CALIBRATED: EstimateMethod
ESTIMATE_METHOD_BASELINE_DELTA: EstimateMethod
ESTIMATE_METHOD_EXACT: EstimateMethod
SIZE_DECISION_UNSPECIFIED: SizeDecision
SIZE_DECISION_FITS: SizeDecision
SIZE_DECISION_COMPRESS_FIRST: SizeDecision
SIZE_DECISION_TOO_LARGE: SizeDecision
COMPRESSION_REASON_UNSPECIFIED: CompressionReason
COMPRESSION_REASON_PRETURN: CompressionReason
COMPRESSION_REASON_MIDTURN: CompressionReason
COMPRESSION_REASON_POSTTURN: CompressionReason
COMPRESSION_REASON_FORCED: CompressionReason
COMPRESSION_REASON_TURN_END: CompressionReason
COMPRESSION_METHOD_UNSPECIFIED: CompressionMethod
COMPRESSION_METHOD_SUMMARY: CompressionMethod
COMPRESSION_METHOD_HARD_TRUNCATE: CompressionMethod
COMPRESSION_METHOD_PRUNE: CompressionMethod

class CompressionSettings(_message.Message):
    __slots__ = ("threshold", "target", "keep_recent", "summary_max_tokens", "summary_temperature", "summarizer_model", "summary_prompt", "critical_tools", "message_token_budget", "summarizer_window", "prune_tool_results", "min_freed", "index_memory")
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    KEEP_RECENT_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    SUMMARIZER_MODEL_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_PROMPT_FIELD_NUMBER: _ClassVar[int]
    CRITICAL_TOOLS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    SUMMARIZER_WINDOW_FIELD_NUMBER: _ClassVar[int]
    PRUNE_TOOL_RESULTS_FIELD_NUMBER: _ClassVar[int]
    MIN_FREED_FIELD_NUMBER: _ClassVar[int]
    INDEX_MEMORY_FIELD_NUMBER: _ClassVar[int]
    threshold: float
    target: float
    keep_recent: int
    summary_max_tokens: int
    summary_temperature: float
    summarizer_model: str
    summary_prompt: str
    critical_tools: _containers.RepeatedScalarFieldContainer[str]
    message_token_budget: int
    summarizer_window: int
    prune_tool_results: bool
    min_freed: float
    index_memory: bool
    def __init__(self, threshold: _Optional[float] = ..., target: _Optional[float] = ..., keep_recent: _Optional[int] = ..., summary_max_tokens: _Optional[int] = ..., summary_temperature: _Optional[float] = ..., summarizer_model: _Optional[str] = ..., summary_prompt: _Optional[str] = ..., critical_tools: _Optional[_Iterable[str]] = ..., message_token_budget: _Optional[int] = ..., summarizer_window: _Optional[int] = ..., prune_tool_results: _Optional[bool] = ..., min_freed: _Optional[float] = ..., index_memory: _Optional[bool] = ...) -> None: ...

class ViewCut(_message.Message):
    __slots__ = ("index", "content")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    index: int
    content: str
    def __init__(self, index: _Optional[int] = ..., content: _Optional[str] = ...) -> None: ...

class EstimateTokensRequest(_message.Message):
    __slots__ = ("model", "messages", "session_id", "incoming", "window", "settings", "tool_schemas", "preamble")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    INCOMING_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    TOOL_SCHEMAS_FIELD_NUMBER: _ClassVar[int]
    PREAMBLE_FIELD_NUMBER: _ClassVar[int]
    model: str
    messages: _containers.RepeatedCompositeFieldContainer[_common_pb2.Message]
    session_id: str
    incoming: _containers.RepeatedCompositeFieldContainer[_common_pb2.Message]
    window: int
    settings: CompressionSettings
    tool_schemas: _containers.RepeatedScalarFieldContainer[str]
    preamble: _containers.RepeatedCompositeFieldContainer[_common_pb2.Message]
    def __init__(self, model: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[_common_pb2.Message, _Mapping]]] = ..., session_id: _Optional[str] = ..., incoming: _Optional[_Iterable[_Union[_common_pb2.Message, _Mapping]]] = ..., window: _Optional[int] = ..., settings: _Optional[_Union[CompressionSettings, _Mapping]] = ..., tool_schemas: _Optional[_Iterable[str]] = ..., preamble: _Optional[_Iterable[_Union[_common_pb2.Message, _Mapping]]] = ...) -> None: ...

class EstimateTokensResponse(_message.Message):
    __slots__ = ("tokens", "text_tokens", "image_tokens", "chars", "method", "baseline_tokens", "delta_tokens", "shape", "counted")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    IMAGE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CHARS_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    BASELINE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DELTA_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    COUNTED_FIELD_NUMBER: _ClassVar[int]
    tokens: int
    text_tokens: int
    image_tokens: int
    chars: int
    method: EstimateMethod
    baseline_tokens: int
    delta_tokens: int
    shape: _common_pb2.PromptShape
    counted: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tokens: _Optional[int] = ..., text_tokens: _Optional[int] = ..., image_tokens: _Optional[int] = ..., chars: _Optional[int] = ..., method: _Optional[_Union[EstimateMethod, str]] = ..., baseline_tokens: _Optional[int] = ..., delta_tokens: _Optional[int] = ..., shape: _Optional[_Union[_common_pb2.PromptShape, _Mapping]] = ..., counted: _Optional[_Iterable[str]] = ...) -> None: ...

class RecordBaselineRequest(_message.Message):
    __slots__ = ("session_id", "model", "prompt_eval_count", "sent_tokens", "sent_chars", "had_images", "through_seq", "window", "shape", "method")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_EVAL_COUNT_FIELD_NUMBER: _ClassVar[int]
    SENT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SENT_CHARS_FIELD_NUMBER: _ClassVar[int]
    HAD_IMAGES_FIELD_NUMBER: _ClassVar[int]
    THROUGH_SEQ_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    model: str
    prompt_eval_count: int
    sent_tokens: int
    sent_chars: int
    had_images: bool
    through_seq: int
    window: int
    shape: _common_pb2.PromptShape
    method: EstimateMethod
    def __init__(self, session_id: _Optional[str] = ..., model: _Optional[str] = ..., prompt_eval_count: _Optional[int] = ..., sent_tokens: _Optional[int] = ..., sent_chars: _Optional[int] = ..., had_images: _Optional[bool] = ..., through_seq: _Optional[int] = ..., window: _Optional[int] = ..., shape: _Optional[_Union[_common_pb2.PromptShape, _Mapping]] = ..., method: _Optional[_Union[EstimateMethod, str]] = ...) -> None: ...

class RecordBaselineResponse(_message.Message):
    __slots__ = ("recorded", "truncated")
    RECORDED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    recorded: bool
    truncated: bool
    def __init__(self, recorded: _Optional[bool] = ..., truncated: _Optional[bool] = ...) -> None: ...

class CheckContextSizeRequest(_message.Message):
    __slots__ = ("model", "messages", "window", "session_id", "settings", "tool_schemas", "keep_recent_messages", "decide_compression")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    TOOL_SCHEMAS_FIELD_NUMBER: _ClassVar[int]
    KEEP_RECENT_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    DECIDE_COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    model: str
    messages: _containers.RepeatedCompositeFieldContainer[_common_pb2.Message]
    window: int
    session_id: str
    settings: CompressionSettings
    tool_schemas: _containers.RepeatedScalarFieldContainer[str]
    keep_recent_messages: int
    decide_compression: bool
    def __init__(self, model: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[_common_pb2.Message, _Mapping]]] = ..., window: _Optional[int] = ..., session_id: _Optional[str] = ..., settings: _Optional[_Union[CompressionSettings, _Mapping]] = ..., tool_schemas: _Optional[_Iterable[str]] = ..., keep_recent_messages: _Optional[int] = ..., decide_compression: _Optional[bool] = ...) -> None: ...

class CheckContextSizeResponse(_message.Message):
    __slots__ = ("fits", "tokens", "limit", "method", "tokens_per_char", "decision", "cuts", "shape", "trigger", "compress_keep_recent_messages", "token_digest", "new_counts")
    FITS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_CHAR_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    CUTS_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_FIELD_NUMBER: _ClassVar[int]
    COMPRESS_KEEP_RECENT_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TOKEN_DIGEST_FIELD_NUMBER: _ClassVar[int]
    NEW_COUNTS_FIELD_NUMBER: _ClassVar[int]
    fits: bool
    tokens: int
    limit: int
    method: EstimateMethod
    tokens_per_char: float
    decision: SizeDecision
    cuts: _containers.RepeatedCompositeFieldContainer[ViewCut]
    shape: _common_pb2.PromptShape
    trigger: int
    compress_keep_recent_messages: int
    token_digest: str
    new_counts: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenCount]
    def __init__(self, fits: _Optional[bool] = ..., tokens: _Optional[int] = ..., limit: _Optional[int] = ..., method: _Optional[_Union[EstimateMethod, str]] = ..., tokens_per_char: _Optional[float] = ..., decision: _Optional[_Union[SizeDecision, str]] = ..., cuts: _Optional[_Iterable[_Union[ViewCut, _Mapping]]] = ..., shape: _Optional[_Union[_common_pb2.PromptShape, _Mapping]] = ..., trigger: _Optional[int] = ..., compress_keep_recent_messages: _Optional[int] = ..., token_digest: _Optional[str] = ..., new_counts: _Optional[_Iterable[_Union[_common_pb2.TokenCount, _Mapping]]] = ...) -> None: ...

class WouldCompressRequest(_message.Message):
    __slots__ = ("session_id", "model", "window", "current_tokens", "keep_recent_messages", "settings")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    CURRENT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KEEP_RECENT_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    model: str
    window: int
    current_tokens: int
    keep_recent_messages: int
    settings: CompressionSettings
    def __init__(self, session_id: _Optional[str] = ..., model: _Optional[str] = ..., window: _Optional[int] = ..., current_tokens: _Optional[int] = ..., keep_recent_messages: _Optional[int] = ..., settings: _Optional[_Union[CompressionSettings, _Mapping]] = ...) -> None: ...

class WouldCompressResponse(_message.Message):
    __slots__ = ("would_compress", "messages_before", "messages_after", "tokens_before", "kept_tokens")
    WOULD_COMPRESS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_BEFORE_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_AFTER_FIELD_NUMBER: _ClassVar[int]
    TOKENS_BEFORE_FIELD_NUMBER: _ClassVar[int]
    KEPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    would_compress: bool
    messages_before: int
    messages_after: int
    tokens_before: int
    kept_tokens: int
    def __init__(self, would_compress: _Optional[bool] = ..., messages_before: _Optional[int] = ..., messages_after: _Optional[int] = ..., tokens_before: _Optional[int] = ..., kept_tokens: _Optional[int] = ...) -> None: ...

class CompressRequest(_message.Message):
    __slots__ = ("session_id", "reason", "model", "window", "keep_recent_messages", "settings", "only_if_over_threshold", "current_tokens", "expected_revision", "prompt_head", "tool_schemas", "next_prompt_tokens")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    KEEP_RECENT_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    ONLY_IF_OVER_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    CURRENT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_REVISION_FIELD_NUMBER: _ClassVar[int]
    PROMPT_HEAD_FIELD_NUMBER: _ClassVar[int]
    TOOL_SCHEMAS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    reason: CompressionReason
    model: str
    window: int
    keep_recent_messages: int
    settings: CompressionSettings
    only_if_over_threshold: bool
    current_tokens: int
    expected_revision: int
    prompt_head: _containers.RepeatedCompositeFieldContainer[_common_pb2.Message]
    tool_schemas: _containers.RepeatedScalarFieldContainer[str]
    next_prompt_tokens: int
    def __init__(self, session_id: _Optional[str] = ..., reason: _Optional[_Union[CompressionReason, str]] = ..., model: _Optional[str] = ..., window: _Optional[int] = ..., keep_recent_messages: _Optional[int] = ..., settings: _Optional[_Union[CompressionSettings, _Mapping]] = ..., only_if_over_threshold: _Optional[bool] = ..., current_tokens: _Optional[int] = ..., expected_revision: _Optional[int] = ..., prompt_head: _Optional[_Iterable[_Union[_common_pb2.Message, _Mapping]]] = ..., tool_schemas: _Optional[_Iterable[str]] = ..., next_prompt_tokens: _Optional[int] = ...) -> None: ...

class CompressionStarted(_message.Message):
    __slots__ = ("context_tokens", "max_context_tokens")
    CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    context_tokens: int
    max_context_tokens: int
    def __init__(self, context_tokens: _Optional[int] = ..., max_context_tokens: _Optional[int] = ...) -> None: ...

class ContextCompressed(_message.Message):
    __slots__ = ("summary", "messages_before", "messages_after", "context_tokens", "max_context_tokens", "method", "breadcrumbs", "replaced", "chunks_indexed", "revision", "tokens_before", "tokens_after", "target_tokens", "shortfall")
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_BEFORE_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_AFTER_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    BREADCRUMBS_FIELD_NUMBER: _ClassVar[int]
    REPLACED_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_INDEXED_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    TOKENS_BEFORE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_AFTER_FIELD_NUMBER: _ClassVar[int]
    TARGET_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SHORTFALL_FIELD_NUMBER: _ClassVar[int]
    summary: str
    messages_before: int
    messages_after: int
    context_tokens: int
    max_context_tokens: int
    method: CompressionMethod
    breadcrumbs: _containers.RepeatedScalarFieldContainer[str]
    replaced: _common_pb2.SeqRange
    chunks_indexed: int
    revision: int
    tokens_before: int
    tokens_after: int
    target_tokens: int
    shortfall: str
    def __init__(self, summary: _Optional[str] = ..., messages_before: _Optional[int] = ..., messages_after: _Optional[int] = ..., context_tokens: _Optional[int] = ..., max_context_tokens: _Optional[int] = ..., method: _Optional[_Union[CompressionMethod, str]] = ..., breadcrumbs: _Optional[_Iterable[str]] = ..., replaced: _Optional[_Union[_common_pb2.SeqRange, _Mapping]] = ..., chunks_indexed: _Optional[int] = ..., revision: _Optional[int] = ..., tokens_before: _Optional[int] = ..., tokens_after: _Optional[int] = ..., target_tokens: _Optional[int] = ..., shortfall: _Optional[str] = ...) -> None: ...

class CompressionEvent(_message.Message):
    __slots__ = ("started", "compressed")
    STARTED_FIELD_NUMBER: _ClassVar[int]
    COMPRESSED_FIELD_NUMBER: _ClassVar[int]
    started: CompressionStarted
    compressed: ContextCompressed
    def __init__(self, started: _Optional[_Union[CompressionStarted, _Mapping]] = ..., compressed: _Optional[_Union[ContextCompressed, _Mapping]] = ...) -> None: ...
