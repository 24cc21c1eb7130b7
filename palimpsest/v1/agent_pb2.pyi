from google.protobuf import struct_pb2 as _struct_pb2
from palimpsest.v1 import common_pb2 as _common_pb2
from palimpsest.v1 import compressor_pb2 as _compressor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class McpServerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MCP_SERVER_STATE_UNSPECIFIED: _ClassVar[McpServerState]
    MCP_SERVER_STATE_CONNECTING: _ClassVar[McpServerState]
    MCP_SERVER_STATE_READY: _ClassVar[McpServerState]
    MCP_SERVER_STATE_FAILED: _ClassVar[McpServerState]

class StreamEndReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STREAM_END_REASON_UNSPECIFIED: _ClassVar[StreamEndReason]
    STREAM_END_REASON_COMPLETED: _ClassVar[StreamEndReason]
    STREAM_END_REASON_STOPPED: _ClassVar[StreamEndReason]
    STREAM_END_REASON_MAX_ITERATIONS: _ClassVar[StreamEndReason]
    STREAM_END_REASON_CONTEXT_TOO_LARGE: _ClassVar[StreamEndReason]
    STREAM_END_REASON_ERROR: _ClassVar[StreamEndReason]
MCP_SERVER_STATE_UNSPECIFIED: McpServerState
MCP_SERVER_STATE_CONNECTING: McpServerState
MCP_SERVER_STATE_READY: McpServerState
MCP_SERVER_STATE_FAILED: McpServerState
STREAM_END_REASON_UNSPECIFIED: StreamEndReason
STREAM_END_REASON_COMPLETED: StreamEndReason
STREAM_END_REASON_STOPPED: StreamEndReason
STREAM_END_REASON_MAX_ITERATIONS: StreamEndReason
STREAM_END_REASON_CONTEXT_TOO_LARGE: StreamEndReason
STREAM_END_REASON_ERROR: StreamEndReason

class ClientTool(_message.Message):
    __slots__ = ("name", "description", "parameters_json", "read_only")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_JSON_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    parameters_json: str
    read_only: bool
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., parameters_json: _Optional[str] = ..., read_only: _Optional[bool] = ...) -> None: ...

class SubmitToolResultRequest(_message.Message):
    __slots__ = ("session_id", "turn_id", "call_id", "content", "is_error")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    IS_ERROR_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    turn_id: str
    call_id: str
    content: str
    is_error: bool
    def __init__(self, session_id: _Optional[str] = ..., turn_id: _Optional[str] = ..., call_id: _Optional[str] = ..., content: _Optional[str] = ..., is_error: _Optional[bool] = ...) -> None: ...

class SubmitToolResultResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RunStreamRequest(_message.Message):
    __slots__ = ("session_id", "profile_id", "text", "images", "hidden", "external_refs", "attachments", "inline_attachments", "stop_on_disconnect", "cwd", "client_tools", "client_tool_timeout_seconds")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PROFILE_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_REFS_FIELD_NUMBER: _ClassVar[int]
    ATTACHMENTS_FIELD_NUMBER: _ClassVar[int]
    INLINE_ATTACHMENTS_FIELD_NUMBER: _ClassVar[int]
    STOP_ON_DISCONNECT_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    CLIENT_TOOLS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_TOOL_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    profile_id: str
    text: str
    images: _containers.RepeatedScalarFieldContainer[bytes]
    hidden: bool
    external_refs: _containers.RepeatedCompositeFieldContainer[_common_pb2.ExternalRef]
    attachments: _containers.RepeatedScalarFieldContainer[str]
    inline_attachments: _containers.RepeatedCompositeFieldContainer[InlineAttachment]
    stop_on_disconnect: bool
    cwd: str
    client_tools: _containers.RepeatedCompositeFieldContainer[ClientTool]
    client_tool_timeout_seconds: int
    def __init__(self, session_id: _Optional[str] = ..., profile_id: _Optional[str] = ..., text: _Optional[str] = ..., images: _Optional[_Iterable[bytes]] = ..., hidden: _Optional[bool] = ..., external_refs: _Optional[_Iterable[_Union[_common_pb2.ExternalRef, _Mapping]]] = ..., attachments: _Optional[_Iterable[str]] = ..., inline_attachments: _Optional[_Iterable[_Union[InlineAttachment, _Mapping]]] = ..., stop_on_disconnect: _Optional[bool] = ..., cwd: _Optional[str] = ..., client_tools: _Optional[_Iterable[_Union[ClientTool, _Mapping]]] = ..., client_tool_timeout_seconds: _Optional[int] = ...) -> None: ...

class RunRequest(_message.Message):
    __slots__ = ("session_id", "profile_id", "text", "images", "hidden", "external_refs", "attachments", "inline_attachments", "stop_on_disconnect", "cwd", "client_tools", "client_tool_timeout_seconds")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PROFILE_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_REFS_FIELD_NUMBER: _ClassVar[int]
    ATTACHMENTS_FIELD_NUMBER: _ClassVar[int]
    INLINE_ATTACHMENTS_FIELD_NUMBER: _ClassVar[int]
    STOP_ON_DISCONNECT_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    CLIENT_TOOLS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_TOOL_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    profile_id: str
    text: str
    images: _containers.RepeatedScalarFieldContainer[bytes]
    hidden: bool
    external_refs: _containers.RepeatedCompositeFieldContainer[_common_pb2.ExternalRef]
    attachments: _containers.RepeatedScalarFieldContainer[str]
    inline_attachments: _containers.RepeatedCompositeFieldContainer[InlineAttachment]
    stop_on_disconnect: bool
    cwd: str
    client_tools: _containers.RepeatedCompositeFieldContainer[ClientTool]
    client_tool_timeout_seconds: int
    def __init__(self, session_id: _Optional[str] = ..., profile_id: _Optional[str] = ..., text: _Optional[str] = ..., images: _Optional[_Iterable[bytes]] = ..., hidden: _Optional[bool] = ..., external_refs: _Optional[_Iterable[_Union[_common_pb2.ExternalRef, _Mapping]]] = ..., attachments: _Optional[_Iterable[str]] = ..., inline_attachments: _Optional[_Iterable[_Union[InlineAttachment, _Mapping]]] = ..., stop_on_disconnect: _Optional[bool] = ..., cwd: _Optional[str] = ..., client_tools: _Optional[_Iterable[_Union[ClientTool, _Mapping]]] = ..., client_tool_timeout_seconds: _Optional[int] = ...) -> None: ...

class InlineAttachment(_message.Message):
    __slots__ = ("filename", "data")
    FILENAME_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    filename: str
    data: bytes
    def __init__(self, filename: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class RunResponse(_message.Message):
    __slots__ = ("session_id", "text", "reason")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    text: str
    reason: StreamEndReason
    def __init__(self, session_id: _Optional[str] = ..., text: _Optional[str] = ..., reason: _Optional[_Union[StreamEndReason, str]] = ...) -> None: ...

class RunEphemeralRequest(_message.Message):
    __slots__ = ("text", "profile_id", "max_iterations", "exclude_tools", "briefing", "custom_system_prompt", "inherit_system_prompt", "context_transfer", "parent_session_id", "timeout_seconds")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    PROFILE_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_TOOLS_FIELD_NUMBER: _ClassVar[int]
    BRIEFING_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_SYSTEM_PROMPT_FIELD_NUMBER: _ClassVar[int]
    INHERIT_SYSTEM_PROMPT_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TRANSFER_FIELD_NUMBER: _ClassVar[int]
    PARENT_SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    text: str
    profile_id: str
    max_iterations: int
    exclude_tools: _containers.RepeatedScalarFieldContainer[str]
    briefing: str
    custom_system_prompt: str
    inherit_system_prompt: bool
    context_transfer: str
    parent_session_id: str
    timeout_seconds: float
    def __init__(self, text: _Optional[str] = ..., profile_id: _Optional[str] = ..., max_iterations: _Optional[int] = ..., exclude_tools: _Optional[_Iterable[str]] = ..., briefing: _Optional[str] = ..., custom_system_prompt: _Optional[str] = ..., inherit_system_prompt: _Optional[bool] = ..., context_transfer: _Optional[str] = ..., parent_session_id: _Optional[str] = ..., timeout_seconds: _Optional[float] = ...) -> None: ...

class RunEphemeralResponse(_message.Message):
    __slots__ = ("text", "completed_normally")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_NORMALLY_FIELD_NUMBER: _ClassVar[int]
    text: str
    completed_normally: bool
    def __init__(self, text: _Optional[str] = ..., completed_normally: _Optional[bool] = ...) -> None: ...

class CompactRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class WatchSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class ResumeStreamRequest(_message.Message):
    __slots__ = ("session_id", "turn_id", "after_seq")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    turn_id: str
    after_seq: int
    def __init__(self, session_id: _Optional[str] = ..., turn_id: _Optional[str] = ..., after_seq: _Optional[int] = ...) -> None: ...

class StopRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class StopResponse(_message.Message):
    __slots__ = ("stopped",)
    STOPPED_FIELD_NUMBER: _ClassVar[int]
    stopped: bool
    def __init__(self, stopped: _Optional[bool] = ...) -> None: ...

class ReplicaMessage(_message.Message):
    __slots__ = ("event", "stop", "stopped", "alive", "tool_answer", "tool_answered")
    EVENT_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STOPPED_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    TOOL_ANSWER_FIELD_NUMBER: _ClassVar[int]
    TOOL_ANSWERED_FIELD_NUMBER: _ClassVar[int]
    event: AgentEvent
    stop: str
    stopped: str
    alive: str
    tool_answer: ToolAnswer
    tool_answered: ToolAnswered
    def __init__(self, event: _Optional[_Union[AgentEvent, _Mapping]] = ..., stop: _Optional[str] = ..., stopped: _Optional[str] = ..., alive: _Optional[str] = ..., tool_answer: _Optional[_Union[ToolAnswer, _Mapping]] = ..., tool_answered: _Optional[_Union[ToolAnswered, _Mapping]] = ...) -> None: ...

class ToolAnswer(_message.Message):
    __slots__ = ("request_id", "turn_id", "call_id", "content", "is_error", "trusted")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    IS_ERROR_FIELD_NUMBER: _ClassVar[int]
    TRUSTED_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    turn_id: str
    call_id: str
    content: str
    is_error: bool
    trusted: bool
    def __init__(self, request_id: _Optional[str] = ..., turn_id: _Optional[str] = ..., call_id: _Optional[str] = ..., content: _Optional[str] = ..., is_error: _Optional[bool] = ..., trusted: _Optional[bool] = ...) -> None: ...

class ToolAnswered(_message.Message):
    __slots__ = ("request_id", "outcome")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    outcome: str
    def __init__(self, request_id: _Optional[str] = ..., outcome: _Optional[str] = ...) -> None: ...

class ListProfilesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Profile(_message.Message):
    __slots__ = ("id", "name", "model", "context_window", "max_iterations", "think_enabled", "agent_tools", "subagent_tools", "compression", "description", "mcp_servers")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_WINDOW_FIELD_NUMBER: _ClassVar[int]
    MAX_ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    THINK_ENABLED_FIELD_NUMBER: _ClassVar[int]
    AGENT_TOOLS_FIELD_NUMBER: _ClassVar[int]
    SUBAGENT_TOOLS_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    MCP_SERVERS_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    model: str
    context_window: int
    max_iterations: int
    think_enabled: bool
    agent_tools: _containers.RepeatedScalarFieldContainer[str]
    subagent_tools: _containers.RepeatedScalarFieldContainer[str]
    compression: _compressor_pb2.CompressionSettings
    description: str
    mcp_servers: _containers.RepeatedCompositeFieldContainer[McpServerStatus]
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., model: _Optional[str] = ..., context_window: _Optional[int] = ..., max_iterations: _Optional[int] = ..., think_enabled: _Optional[bool] = ..., agent_tools: _Optional[_Iterable[str]] = ..., subagent_tools: _Optional[_Iterable[str]] = ..., compression: _Optional[_Union[_compressor_pb2.CompressionSettings, _Mapping]] = ..., description: _Optional[str] = ..., mcp_servers: _Optional[_Iterable[_Union[McpServerStatus, _Mapping]]] = ...) -> None: ...

class McpServerStatus(_message.Message):
    __slots__ = ("name", "target", "state", "error", "retry_in_seconds", "tools", "skipped_tools")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RETRY_IN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_TOOLS_FIELD_NUMBER: _ClassVar[int]
    name: str
    target: str
    state: McpServerState
    error: str
    retry_in_seconds: float
    tools: _containers.RepeatedScalarFieldContainer[str]
    skipped_tools: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., target: _Optional[str] = ..., state: _Optional[_Union[McpServerState, str]] = ..., error: _Optional[str] = ..., retry_in_seconds: _Optional[float] = ..., tools: _Optional[_Iterable[str]] = ..., skipped_tools: _Optional[_Iterable[str]] = ...) -> None: ...

class ListProfilesResponse(_message.Message):
    __slots__ = ("profiles", "default_profile_id", "profiles_error", "ollama_host", "sandbox_unavailable")
    PROFILES_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_PROFILE_ID_FIELD_NUMBER: _ClassVar[int]
    PROFILES_ERROR_FIELD_NUMBER: _ClassVar[int]
    OLLAMA_HOST_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    profiles: _containers.RepeatedCompositeFieldContainer[Profile]
    default_profile_id: str
    profiles_error: str
    ollama_host: str
    sandbox_unavailable: str
    def __init__(self, profiles: _Optional[_Iterable[_Union[Profile, _Mapping]]] = ..., default_profile_id: _Optional[str] = ..., profiles_error: _Optional[str] = ..., ollama_host: _Optional[str] = ..., sandbox_unavailable: _Optional[str] = ...) -> None: ...

class TextDelta(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class ThinkingDelta(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class ThinkingEnd(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ToolStarted(_message.Message):
    __slots__ = ("call_id", "name", "arguments_json")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    name: str
    arguments_json: str
    def __init__(self, call_id: _Optional[str] = ..., name: _Optional[str] = ..., arguments_json: _Optional[str] = ...) -> None: ...

class ToolCallRequested(_message.Message):
    __slots__ = ("call_id", "name", "arguments_json", "timeout_seconds")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    name: str
    arguments_json: str
    timeout_seconds: int
    def __init__(self, call_id: _Optional[str] = ..., name: _Optional[str] = ..., arguments_json: _Optional[str] = ..., timeout_seconds: _Optional[int] = ...) -> None: ...

class ToolFinished(_message.Message):
    __slots__ = ("call_id", "name", "preview", "is_error", "elapsed_seconds")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PREVIEW_FIELD_NUMBER: _ClassVar[int]
    IS_ERROR_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    name: str
    preview: str
    is_error: bool
    elapsed_seconds: float
    def __init__(self, call_id: _Optional[str] = ..., name: _Optional[str] = ..., preview: _Optional[str] = ..., is_error: _Optional[bool] = ..., elapsed_seconds: _Optional[float] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("model", "context_window", "requested_context_window")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_WINDOW_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_CONTEXT_WINDOW_FIELD_NUMBER: _ClassVar[int]
    model: str
    context_window: int
    requested_context_window: int
    def __init__(self, model: _Optional[str] = ..., context_window: _Optional[int] = ..., requested_context_window: _Optional[int] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("context_tokens", "max_context_tokens", "prompt_tokens", "completion_tokens", "count_method")
    CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COUNT_METHOD_FIELD_NUMBER: _ClassVar[int]
    context_tokens: int
    max_context_tokens: int
    prompt_tokens: int
    completion_tokens: int
    count_method: str
    def __init__(self, context_tokens: _Optional[int] = ..., max_context_tokens: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., count_method: _Optional[str] = ...) -> None: ...

class PlanningStatus(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: str
    def __init__(self, status: _Optional[str] = ...) -> None: ...

class PlanReady(_message.Message):
    __slots__ = ("plan", "steps", "complexity")
    PLAN_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    COMPLEXITY_FIELD_NUMBER: _ClassVar[int]
    plan: str
    steps: _containers.RepeatedScalarFieldContainer[str]
    complexity: str
    def __init__(self, plan: _Optional[str] = ..., steps: _Optional[_Iterable[str]] = ..., complexity: _Optional[str] = ...) -> None: ...

class TodoItem(_message.Message):
    __slots__ = ("id", "text", "status", "validation")
    ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    VALIDATION_FIELD_NUMBER: _ClassVar[int]
    id: str
    text: str
    status: str
    validation: str
    def __init__(self, id: _Optional[str] = ..., text: _Optional[str] = ..., status: _Optional[str] = ..., validation: _Optional[str] = ...) -> None: ...

class TodoUpdated(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[TodoItem]
    def __init__(self, items: _Optional[_Iterable[_Union[TodoItem, _Mapping]]] = ...) -> None: ...

class TurnStarted(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class SessionRenamed(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class FileShared(_message.Message):
    __slots__ = ("name", "link", "content_type", "size", "viewer", "title", "sandbox")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LINK_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    VIEWER_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_FIELD_NUMBER: _ClassVar[int]
    name: str
    link: str
    content_type: str
    size: int
    viewer: str
    title: str
    sandbox: bool
    def __init__(self, name: _Optional[str] = ..., link: _Optional[str] = ..., content_type: _Optional[str] = ..., size: _Optional[int] = ..., viewer: _Optional[str] = ..., title: _Optional[str] = ..., sandbox: _Optional[bool] = ...) -> None: ...

class StreamEnd(_message.Message):
    __slots__ = ("reason", "text")
    REASON_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    reason: StreamEndReason
    text: str
    def __init__(self, reason: _Optional[_Union[StreamEndReason, str]] = ..., text: _Optional[str] = ...) -> None: ...

class ErrorEvent(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class AgentEvent(_message.Message):
    __slots__ = ("session_id", "seq", "is_subagent", "turn_id", "text_delta", "thinking_delta", "thinking_end", "tool_started", "tool_finished", "model_info", "usage", "compression_started", "context_compressed", "planning_status", "plan_ready", "todo_updated", "stream_end", "error", "turn_started", "session_renamed", "file_shared", "tool_call_requested", "extra")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    IS_SUBAGENT_FIELD_NUMBER: _ClassVar[int]
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_DELTA_FIELD_NUMBER: _ClassVar[int]
    THINKING_DELTA_FIELD_NUMBER: _ClassVar[int]
    THINKING_END_FIELD_NUMBER: _ClassVar[int]
    TOOL_STARTED_FIELD_NUMBER: _ClassVar[int]
    TOOL_FINISHED_FIELD_NUMBER: _ClassVar[int]
    MODEL_INFO_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_STARTED_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_COMPRESSED_FIELD_NUMBER: _ClassVar[int]
    PLANNING_STATUS_FIELD_NUMBER: _ClassVar[int]
    PLAN_READY_FIELD_NUMBER: _ClassVar[int]
    TODO_UPDATED_FIELD_NUMBER: _ClassVar[int]
    STREAM_END_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TURN_STARTED_FIELD_NUMBER: _ClassVar[int]
    SESSION_RENAMED_FIELD_NUMBER: _ClassVar[int]
    FILE_SHARED_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    EXTRA_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    seq: int
    is_subagent: bool
    turn_id: str
    text_delta: TextDelta
    thinking_delta: ThinkingDelta
    thinking_end: ThinkingEnd
    tool_started: ToolStarted
    tool_finished: ToolFinished
    model_info: ModelInfo
    usage: Usage
    compression_started: _compressor_pb2.CompressionStarted
    context_compressed: _compressor_pb2.ContextCompressed
    planning_status: PlanningStatus
    plan_ready: PlanReady
    todo_updated: TodoUpdated
    stream_end: StreamEnd
    error: ErrorEvent
    turn_started: TurnStarted
    session_renamed: SessionRenamed
    file_shared: FileShared
    tool_call_requested: ToolCallRequested
    extra: _struct_pb2.Struct
    def __init__(self, session_id: _Optional[str] = ..., seq: _Optional[int] = ..., is_subagent: _Optional[bool] = ..., turn_id: _Optional[str] = ..., text_delta: _Optional[_Union[TextDelta, _Mapping]] = ..., thinking_delta: _Optional[_Union[ThinkingDelta, _Mapping]] = ..., thinking_end: _Optional[_Union[ThinkingEnd, _Mapping]] = ..., tool_started: _Optional[_Union[ToolStarted, _Mapping]] = ..., tool_finished: _Optional[_Union[ToolFinished, _Mapping]] = ..., model_info: _Optional[_Union[ModelInfo, _Mapping]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., compression_started: _Optional[_Union[_compressor_pb2.CompressionStarted, _Mapping]] = ..., context_compressed: _Optional[_Union[_compressor_pb2.ContextCompressed, _Mapping]] = ..., planning_status: _Optional[_Union[PlanningStatus, _Mapping]] = ..., plan_ready: _Optional[_Union[PlanReady, _Mapping]] = ..., todo_updated: _Optional[_Union[TodoUpdated, _Mapping]] = ..., stream_end: _Optional[_Union[StreamEnd, _Mapping]] = ..., error: _Optional[_Union[ErrorEvent, _Mapping]] = ..., turn_started: _Optional[_Union[TurnStarted, _Mapping]] = ..., session_renamed: _Optional[_Union[SessionRenamed, _Mapping]] = ..., file_shared: _Optional[_Union[FileShared, _Mapping]] = ..., tool_call_requested: _Optional[_Union[ToolCallRequested, _Mapping]] = ..., extra: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...
