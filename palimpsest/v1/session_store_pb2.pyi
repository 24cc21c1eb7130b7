import datetime

from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from palimpsest.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SessionView(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SESSION_VIEW_UNSPECIFIED: _ClassVar[SessionView]
    SESSION_VIEW_SUMMARY: _ClassVar[SessionView]
    SESSION_VIEW_DISPLAY: _ClassVar[SessionView]
    SESSION_VIEW_CONTEXT: _ClassVar[SessionView]
    SESSION_VIEW_FULL: _ClassVar[SessionView]

class SortBy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SORT_BY_UNSPECIFIED: _ClassVar[SortBy]
    SORT_BY_LAST_ACTIVE: _ClassVar[SortBy]
    SORT_BY_CREATED_AT: _ClassVar[SortBy]
    SORT_BY_NAME: _ClassVar[SortBy]
    SORT_BY_MESSAGE_COUNT: _ClassVar[SortBy]
    SORT_BY_RELEVANCE: _ClassVar[SortBy]

class ToolRunOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOOL_RUN_OUTCOME_UNSPECIFIED: _ClassVar[ToolRunOutcome]
    TOOL_RUN_OUTCOME_OK: _ClassVar[ToolRunOutcome]
    TOOL_RUN_OUTCOME_ERROR: _ClassVar[ToolRunOutcome]
    TOOL_RUN_OUTCOME_REFUSED: _ClassVar[ToolRunOutcome]
    TOOL_RUN_OUTCOME_STOPPED: _ClassVar[ToolRunOutcome]

class FileKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FILE_KIND_UNSPECIFIED: _ClassVar[FileKind]
    FILE_KIND_IMAGE: _ClassVar[FileKind]

class MemoryAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MEMORY_ACTION_UNSPECIFIED: _ClassVar[MemoryAction]
    MEMORY_ACTION_ADD: _ClassVar[MemoryAction]
    MEMORY_ACTION_REPLACE: _ClassVar[MemoryAction]
    MEMORY_ACTION_REMOVE: _ClassVar[MemoryAction]
SESSION_VIEW_UNSPECIFIED: SessionView
SESSION_VIEW_SUMMARY: SessionView
SESSION_VIEW_DISPLAY: SessionView
SESSION_VIEW_CONTEXT: SessionView
SESSION_VIEW_FULL: SessionView
SORT_BY_UNSPECIFIED: SortBy
SORT_BY_LAST_ACTIVE: SortBy
SORT_BY_CREATED_AT: SortBy
SORT_BY_NAME: SortBy
SORT_BY_MESSAGE_COUNT: SortBy
SORT_BY_RELEVANCE: SortBy
TOOL_RUN_OUTCOME_UNSPECIFIED: ToolRunOutcome
TOOL_RUN_OUTCOME_OK: ToolRunOutcome
TOOL_RUN_OUTCOME_ERROR: ToolRunOutcome
TOOL_RUN_OUTCOME_REFUSED: ToolRunOutcome
TOOL_RUN_OUTCOME_STOPPED: ToolRunOutcome
FILE_KIND_UNSPECIFIED: FileKind
FILE_KIND_IMAGE: FileKind
MEMORY_ACTION_UNSPECIFIED: MemoryAction
MEMORY_ACTION_ADD: MemoryAction
MEMORY_ACTION_REPLACE: MemoryAction
MEMORY_ACTION_REMOVE: MemoryAction

class CreateSessionRequest(_message.Message):
    __slots__ = ("profile_id", "name", "provider", "model", "external_refs", "metadata")
    PROFILE_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_REFS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    profile_id: str
    name: str
    provider: str
    model: str
    external_refs: _containers.RepeatedCompositeFieldContainer[_common_pb2.ExternalRef]
    metadata: _struct_pb2.Struct
    def __init__(self, profile_id: _Optional[str] = ..., name: _Optional[str] = ..., provider: _Optional[str] = ..., model: _Optional[str] = ..., external_refs: _Optional[_Iterable[_Union[_common_pb2.ExternalRef, _Mapping]]] = ..., metadata: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class CreateSessionResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: _common_pb2.Session
    def __init__(self, session: _Optional[_Union[_common_pb2.Session, _Mapping]] = ...) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ("session_id", "view", "context_offset")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    view: SessionView
    context_offset: int
    def __init__(self, session_id: _Optional[str] = ..., view: _Optional[_Union[SessionView, str]] = ..., context_offset: _Optional[int] = ...) -> None: ...

class GetSessionResponse(_message.Message):
    __slots__ = ("session", "has_more_messages", "has_more_context")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    HAS_MORE_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    HAS_MORE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    session: _common_pb2.Session
    has_more_messages: bool
    has_more_context: bool
    def __init__(self, session: _Optional[_Union[_common_pb2.Session, _Mapping]] = ..., has_more_messages: _Optional[bool] = ..., has_more_context: _Optional[bool] = ...) -> None: ...

class ListSessionsRequest(_message.Message):
    __slots__ = ("profile_id", "query", "sort_by", "descending", "page_size", "offset", "embed_model")
    PROFILE_ID_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    SORT_BY_FIELD_NUMBER: _ClassVar[int]
    DESCENDING_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    EMBED_MODEL_FIELD_NUMBER: _ClassVar[int]
    profile_id: str
    query: str
    sort_by: SortBy
    descending: bool
    page_size: int
    offset: int
    embed_model: str
    def __init__(self, profile_id: _Optional[str] = ..., query: _Optional[str] = ..., sort_by: _Optional[_Union[SortBy, str]] = ..., descending: _Optional[bool] = ..., page_size: _Optional[int] = ..., offset: _Optional[int] = ..., embed_model: _Optional[str] = ...) -> None: ...

class ListSessionsResponse(_message.Message):
    __slots__ = ("sessions", "total", "has_more", "semantic")
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    HAS_MORE_FIELD_NUMBER: _ClassVar[int]
    SEMANTIC_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[_common_pb2.SessionSummary]
    total: int
    has_more: bool
    semantic: bool
    def __init__(self, sessions: _Optional[_Iterable[_Union[_common_pb2.SessionSummary, _Mapping]]] = ..., total: _Optional[int] = ..., has_more: _Optional[bool] = ..., semantic: _Optional[bool] = ...) -> None: ...

class SearchMatchesRequest(_message.Message):
    __slots__ = ("session_ids", "query")
    SESSION_IDS_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    session_ids: _containers.RepeatedScalarFieldContainer[str]
    query: str
    def __init__(self, session_ids: _Optional[_Iterable[str]] = ..., query: _Optional[str] = ...) -> None: ...

class SessionMatch(_message.Message):
    __slots__ = ("session_id", "display_indices", "snippet")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_INDICES_FIELD_NUMBER: _ClassVar[int]
    SNIPPET_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    display_indices: _containers.RepeatedScalarFieldContainer[int]
    snippet: str
    def __init__(self, session_id: _Optional[str] = ..., display_indices: _Optional[_Iterable[int]] = ..., snippet: _Optional[str] = ...) -> None: ...

class SearchMatchesResponse(_message.Message):
    __slots__ = ("matches",)
    MATCHES_FIELD_NUMBER: _ClassVar[int]
    matches: _containers.RepeatedCompositeFieldContainer[SessionMatch]
    def __init__(self, matches: _Optional[_Iterable[_Union[SessionMatch, _Mapping]]] = ...) -> None: ...

class GetHistoryPageRequest(_message.Message):
    __slots__ = ("session_id", "before_seq", "limit")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    BEFORE_SEQ_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    before_seq: int
    limit: int
    def __init__(self, session_id: _Optional[str] = ..., before_seq: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class GetHistoryPageResponse(_message.Message):
    __slots__ = ("messages", "has_more")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    HAS_MORE_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[_common_pb2.Message]
    has_more: bool
    def __init__(self, messages: _Optional[_Iterable[_Union[_common_pb2.Message, _Mapping]]] = ..., has_more: _Optional[bool] = ...) -> None: ...

class GetArchivedMessagesRequest(_message.Message):
    __slots__ = ("session_id", "before_seq", "limit")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    BEFORE_SEQ_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    before_seq: int
    limit: int
    def __init__(self, session_id: _Optional[str] = ..., before_seq: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class GetArchivedMessagesResponse(_message.Message):
    __slots__ = ("messages", "has_more")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    HAS_MORE_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[_common_pb2.Message]
    has_more: bool
    def __init__(self, messages: _Optional[_Iterable[_Union[_common_pb2.Message, _Mapping]]] = ..., has_more: _Optional[bool] = ...) -> None: ...

class AppendMessagesRequest(_message.Message):
    __slots__ = ("session_id", "messages", "expected_revision", "idempotency_key", "report", "expected_next_seq", "tool_runs")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_REVISION_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_NEXT_SEQ_FIELD_NUMBER: _ClassVar[int]
    TOOL_RUNS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    messages: _containers.RepeatedCompositeFieldContainer[_common_pb2.Message]
    expected_revision: int
    idempotency_key: str
    report: ModelReport
    expected_next_seq: int
    tool_runs: _containers.RepeatedCompositeFieldContainer[ToolRun]
    def __init__(self, session_id: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[_common_pb2.Message, _Mapping]]] = ..., expected_revision: _Optional[int] = ..., idempotency_key: _Optional[str] = ..., report: _Optional[_Union[ModelReport, _Mapping]] = ..., expected_next_seq: _Optional[int] = ..., tool_runs: _Optional[_Iterable[_Union[ToolRun, _Mapping]]] = ...) -> None: ...

class ToolRun(_message.Message):
    __slots__ = ("seq", "turn_id", "call_id", "is_subagent", "tool", "arguments_json", "started_at", "duration_seconds", "outcome", "bytes_in", "bytes_out", "error", "call_seq")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    IS_SUBAGENT_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    DURATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    BYTES_IN_FIELD_NUMBER: _ClassVar[int]
    BYTES_OUT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CALL_SEQ_FIELD_NUMBER: _ClassVar[int]
    seq: int
    turn_id: str
    call_id: str
    is_subagent: bool
    tool: str
    arguments_json: str
    started_at: _timestamp_pb2.Timestamp
    duration_seconds: float
    outcome: ToolRunOutcome
    bytes_in: int
    bytes_out: int
    error: str
    call_seq: int
    def __init__(self, seq: _Optional[int] = ..., turn_id: _Optional[str] = ..., call_id: _Optional[str] = ..., is_subagent: _Optional[bool] = ..., tool: _Optional[str] = ..., arguments_json: _Optional[str] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., duration_seconds: _Optional[float] = ..., outcome: _Optional[_Union[ToolRunOutcome, str]] = ..., bytes_in: _Optional[int] = ..., bytes_out: _Optional[int] = ..., error: _Optional[str] = ..., call_seq: _Optional[int] = ...) -> None: ...

class ListToolRunsRequest(_message.Message):
    __slots__ = ("session_id", "before_seq", "after_seq", "limit")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    BEFORE_SEQ_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    before_seq: int
    after_seq: int
    limit: int
    def __init__(self, session_id: _Optional[str] = ..., before_seq: _Optional[int] = ..., after_seq: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class ListToolRunsResponse(_message.Message):
    __slots__ = ("runs", "has_more")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    HAS_MORE_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[ToolRun]
    has_more: bool
    def __init__(self, runs: _Optional[_Iterable[_Union[ToolRun, _Mapping]]] = ..., has_more: _Optional[bool] = ...) -> None: ...

class ModelReport(_message.Message):
    __slots__ = ("baseline", "prompt_cut", "observation", "context_token_count", "token_digest", "token_counts")
    BASELINE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_CUT_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_DIGEST_FIELD_NUMBER: _ClassVar[int]
    TOKEN_COUNTS_FIELD_NUMBER: _ClassVar[int]
    baseline: Baseline
    prompt_cut: bool
    observation: Observation
    context_token_count: int
    token_digest: str
    token_counts: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenCount]
    def __init__(self, baseline: _Optional[_Union[Baseline, _Mapping]] = ..., prompt_cut: _Optional[bool] = ..., observation: _Optional[_Union[Observation, _Mapping]] = ..., context_token_count: _Optional[int] = ..., token_digest: _Optional[str] = ..., token_counts: _Optional[_Iterable[_Union[_common_pb2.TokenCount, _Mapping]]] = ...) -> None: ...

class AppendMessagesResponse(_message.Message):
    __slots__ = ("seqs", "revision", "context_truncated", "session_changed")
    SEQS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    SESSION_CHANGED_FIELD_NUMBER: _ClassVar[int]
    seqs: _containers.RepeatedScalarFieldContainer[int]
    revision: int
    context_truncated: bool
    session_changed: bool
    def __init__(self, seqs: _Optional[_Iterable[int]] = ..., revision: _Optional[int] = ..., context_truncated: _Optional[bool] = ..., session_changed: _Optional[bool] = ...) -> None: ...

class ClaimTurnRequest(_message.Message):
    __slots__ = ("session_id", "holder", "ttl_seconds", "release")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    holder: str
    ttl_seconds: int
    release: bool
    def __init__(self, session_id: _Optional[str] = ..., holder: _Optional[str] = ..., ttl_seconds: _Optional[int] = ..., release: _Optional[bool] = ...) -> None: ...

class ClaimTurnResponse(_message.Message):
    __slots__ = ("granted", "holder", "expires_in_seconds")
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    granted: bool
    holder: str
    expires_in_seconds: float
    def __init__(self, granted: _Optional[bool] = ..., holder: _Optional[str] = ..., expires_in_seconds: _Optional[float] = ...) -> None: ...

class UpdateSessionRequest(_message.Message):
    __slots__ = ("session_id", "name", "pinned", "profile_id", "context_token_count", "metadata", "provider", "model", "add_external_refs", "mark_untrusted_ingested", "mark_episode_untrusted", "mark_sandboxed", "planning_log", "expected_revision")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    PROFILE_ID_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ADD_EXTERNAL_REFS_FIELD_NUMBER: _ClassVar[int]
    MARK_UNTRUSTED_INGESTED_FIELD_NUMBER: _ClassVar[int]
    MARK_EPISODE_UNTRUSTED_FIELD_NUMBER: _ClassVar[int]
    MARK_SANDBOXED_FIELD_NUMBER: _ClassVar[int]
    PLANNING_LOG_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_REVISION_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    name: str
    pinned: bool
    profile_id: str
    context_token_count: int
    metadata: _struct_pb2.Struct
    provider: str
    model: str
    add_external_refs: _containers.RepeatedCompositeFieldContainer[_common_pb2.ExternalRef]
    mark_untrusted_ingested: bool
    mark_episode_untrusted: bool
    mark_sandboxed: bool
    planning_log: _struct_pb2.Struct
    expected_revision: int
    def __init__(self, session_id: _Optional[str] = ..., name: _Optional[str] = ..., pinned: _Optional[bool] = ..., profile_id: _Optional[str] = ..., context_token_count: _Optional[int] = ..., metadata: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., provider: _Optional[str] = ..., model: _Optional[str] = ..., add_external_refs: _Optional[_Iterable[_Union[_common_pb2.ExternalRef, _Mapping]]] = ..., mark_untrusted_ingested: _Optional[bool] = ..., mark_episode_untrusted: _Optional[bool] = ..., mark_sandboxed: _Optional[bool] = ..., planning_log: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., expected_revision: _Optional[int] = ...) -> None: ...

class UpdateSessionResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: _common_pb2.Session
    def __init__(self, session: _Optional[_Union[_common_pb2.Session, _Mapping]] = ...) -> None: ...

class SetContextFlagRequest(_message.Message):
    __slots__ = ("session_id", "seqs", "is_context", "expected_revision")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SEQS_FIELD_NUMBER: _ClassVar[int]
    IS_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_REVISION_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    seqs: _containers.RepeatedScalarFieldContainer[int]
    is_context: bool
    expected_revision: int
    def __init__(self, session_id: _Optional[str] = ..., seqs: _Optional[_Iterable[int]] = ..., is_context: _Optional[bool] = ..., expected_revision: _Optional[int] = ...) -> None: ...

class SetContextFlagResponse(_message.Message):
    __slots__ = ("updated", "revision")
    UPDATED_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    updated: int
    revision: int
    def __init__(self, updated: _Optional[int] = ..., revision: _Optional[int] = ...) -> None: ...

class CommitCompressionRequest(_message.Message):
    __slots__ = ("session_id", "demote_seqs", "summary", "marker", "context_token_count", "chunks", "expected_revision", "archive", "replacements")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DEMOTE_SEQS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    MARKER_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_REVISION_FIELD_NUMBER: _ClassVar[int]
    ARCHIVE_FIELD_NUMBER: _ClassVar[int]
    REPLACEMENTS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    demote_seqs: _containers.RepeatedScalarFieldContainer[int]
    summary: _common_pb2.Message
    marker: _common_pb2.Message
    context_token_count: int
    chunks: _containers.RepeatedCompositeFieldContainer[_common_pb2.RawChunk]
    expected_revision: int
    archive: bool
    replacements: _containers.RepeatedCompositeFieldContainer[_common_pb2.Message]
    def __init__(self, session_id: _Optional[str] = ..., demote_seqs: _Optional[_Iterable[int]] = ..., summary: _Optional[_Union[_common_pb2.Message, _Mapping]] = ..., marker: _Optional[_Union[_common_pb2.Message, _Mapping]] = ..., context_token_count: _Optional[int] = ..., chunks: _Optional[_Iterable[_Union[_common_pb2.RawChunk, _Mapping]]] = ..., expected_revision: _Optional[int] = ..., archive: _Optional[bool] = ..., replacements: _Optional[_Iterable[_Union[_common_pb2.Message, _Mapping]]] = ...) -> None: ...

class CommitCompressionResponse(_message.Message):
    __slots__ = ("summary_seq", "marker_seq", "revision", "archived", "chunks_indexed")
    SUMMARY_SEQ_FIELD_NUMBER: _ClassVar[int]
    MARKER_SEQ_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    ARCHIVED_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_INDEXED_FIELD_NUMBER: _ClassVar[int]
    summary_seq: int
    marker_seq: int
    revision: int
    archived: int
    chunks_indexed: int
    def __init__(self, summary_seq: _Optional[int] = ..., marker_seq: _Optional[int] = ..., revision: _Optional[int] = ..., archived: _Optional[int] = ..., chunks_indexed: _Optional[int] = ...) -> None: ...

class ArchiveOldMessagesRequest(_message.Message):
    __slots__ = ("session_id", "below_seq")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    BELOW_SEQ_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    below_seq: int
    def __init__(self, session_id: _Optional[str] = ..., below_seq: _Optional[int] = ...) -> None: ...

class ArchiveOldMessagesResponse(_message.Message):
    __slots__ = ("archived",)
    ARCHIVED_FIELD_NUMBER: _ClassVar[int]
    archived: int
    def __init__(self, archived: _Optional[int] = ...) -> None: ...

class TrimSessionRequest(_message.Message):
    __slots__ = ("session_id", "keep")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    KEEP_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    keep: int
    def __init__(self, session_id: _Optional[str] = ..., keep: _Optional[int] = ...) -> None: ...

class TrimSessionResponse(_message.Message):
    __slots__ = ("before", "after", "dropped")
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    before: int
    after: int
    dropped: int
    def __init__(self, before: _Optional[int] = ..., after: _Optional[int] = ..., dropped: _Optional[int] = ...) -> None: ...

class CleanupSessionsRequest(_message.Message):
    __slots__ = ("older_than_days",)
    OLDER_THAN_DAYS_FIELD_NUMBER: _ClassVar[int]
    older_than_days: int
    def __init__(self, older_than_days: _Optional[int] = ...) -> None: ...

class CleanupSessionsResponse(_message.Message):
    __slots__ = ("deleted", "session_ids")
    DELETED_FIELD_NUMBER: _ClassVar[int]
    SESSION_IDS_FIELD_NUMBER: _ClassVar[int]
    deleted: int
    session_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, deleted: _Optional[int] = ..., session_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class DeleteSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class DeleteSessionResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: _Optional[bool] = ...) -> None: ...

class CreateShareRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CreateShareResponse(_message.Message):
    __slots__ = ("token", "created_at")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    token: str
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, token: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GetSharedRequest(_message.Message):
    __slots__ = ("token", "before_seq", "limit")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    BEFORE_SEQ_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    token: str
    before_seq: int
    limit: int
    def __init__(self, token: _Optional[str] = ..., before_seq: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class GetSharedResponse(_message.Message):
    __slots__ = ("name", "profile_id", "created_at", "last_active", "messages", "has_more")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PROFILE_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    HAS_MORE_FIELD_NUMBER: _ClassVar[int]
    name: str
    profile_id: str
    created_at: _timestamp_pb2.Timestamp
    last_active: _timestamp_pb2.Timestamp
    messages: _containers.RepeatedCompositeFieldContainer[_common_pb2.Message]
    has_more: bool
    def __init__(self, name: _Optional[str] = ..., profile_id: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_active: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., messages: _Optional[_Iterable[_Union[_common_pb2.Message, _Mapping]]] = ..., has_more: _Optional[bool] = ...) -> None: ...

class SearchMemoryRequest(_message.Message):
    __slots__ = ("session_id", "query", "limit", "min_similarity", "embed_model")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    MIN_SIMILARITY_FIELD_NUMBER: _ClassVar[int]
    EMBED_MODEL_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    query: str
    limit: int
    min_similarity: float
    embed_model: str
    def __init__(self, session_id: _Optional[str] = ..., query: _Optional[str] = ..., limit: _Optional[int] = ..., min_similarity: _Optional[float] = ..., embed_model: _Optional[str] = ...) -> None: ...

class SearchMemoryResponse(_message.Message):
    __slots__ = ("chunks", "semantic")
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    SEMANTIC_FIELD_NUMBER: _ClassVar[int]
    chunks: _containers.RepeatedCompositeFieldContainer[_common_pb2.RawChunk]
    semantic: bool
    def __init__(self, chunks: _Optional[_Iterable[_Union[_common_pb2.RawChunk, _Mapping]]] = ..., semantic: _Optional[bool] = ...) -> None: ...

class PutFileHeader(_message.Message):
    __slots__ = ("session_id", "filename", "kind", "from_tool", "path", "outside_content")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FILENAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    FROM_TOOL_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    OUTSIDE_CONTENT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    filename: str
    kind: FileKind
    from_tool: bool
    path: str
    outside_content: bool
    def __init__(self, session_id: _Optional[str] = ..., filename: _Optional[str] = ..., kind: _Optional[_Union[FileKind, str]] = ..., from_tool: _Optional[bool] = ..., path: _Optional[str] = ..., outside_content: _Optional[bool] = ...) -> None: ...

class PutFileRequest(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: PutFileHeader
    chunk: bytes
    def __init__(self, header: _Optional[_Union[PutFileHeader, _Mapping]] = ..., chunk: _Optional[bytes] = ...) -> None: ...

class PutFileResponse(_message.Message):
    __slots__ = ("file", "deduplicated")
    FILE_FIELD_NUMBER: _ClassVar[int]
    DEDUPLICATED_FIELD_NUMBER: _ClassVar[int]
    file: _common_pb2.FileInfo
    deduplicated: bool
    def __init__(self, file: _Optional[_Union[_common_pb2.FileInfo, _Mapping]] = ..., deduplicated: _Optional[bool] = ...) -> None: ...

class GetFileRequest(_message.Message):
    __slots__ = ("session_id", "name")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    name: str
    def __init__(self, session_id: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class GetFileResponse(_message.Message):
    __slots__ = ("info", "chunk")
    INFO_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    info: _common_pb2.FileInfo
    chunk: bytes
    def __init__(self, info: _Optional[_Union[_common_pb2.FileInfo, _Mapping]] = ..., chunk: _Optional[bytes] = ...) -> None: ...

class ListFilesRequest(_message.Message):
    __slots__ = ("session_id", "unless_token")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    UNLESS_TOKEN_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    unless_token: str
    def __init__(self, session_id: _Optional[str] = ..., unless_token: _Optional[str] = ...) -> None: ...

class ListFilesResponse(_message.Message):
    __slots__ = ("files", "token", "unchanged")
    FILES_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    files: _containers.RepeatedCompositeFieldContainer[_common_pb2.FileInfo]
    token: str
    unchanged: bool
    def __init__(self, files: _Optional[_Iterable[_Union[_common_pb2.FileInfo, _Mapping]]] = ..., token: _Optional[str] = ..., unchanged: _Optional[bool] = ...) -> None: ...

class DeleteFileRequest(_message.Message):
    __slots__ = ("session_id", "name")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    name: str
    def __init__(self, session_id: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class DeleteFileResponse(_message.Message):
    __slots__ = ("freed",)
    FREED_FIELD_NUMBER: _ClassVar[int]
    freed: int
    def __init__(self, freed: _Optional[int] = ...) -> None: ...

class MemoryEntry(_message.Message):
    __slots__ = ("id", "text", "created_at", "updated_at", "session_id")
    ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    text: str
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    session_id: str
    def __init__(self, id: _Optional[int] = ..., text: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., session_id: _Optional[str] = ...) -> None: ...

class PendingMemoryWrite(_message.Message):
    __slots__ = ("id", "action", "entry_id", "old_text", "text", "session_id", "created_at")
    ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    OLD_TEXT_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    id: int
    action: MemoryAction
    entry_id: int
    old_text: str
    text: str
    session_id: str
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[int] = ..., action: _Optional[_Union[MemoryAction, str]] = ..., entry_id: _Optional[int] = ..., old_text: _Optional[str] = ..., text: _Optional[str] = ..., session_id: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GetMemoryRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetMemoryResponse(_message.Message):
    __slots__ = ("revision", "entries", "pending", "max_entries", "max_chars", "chars")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    MAX_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    MAX_CHARS_FIELD_NUMBER: _ClassVar[int]
    CHARS_FIELD_NUMBER: _ClassVar[int]
    revision: int
    entries: _containers.RepeatedCompositeFieldContainer[MemoryEntry]
    pending: _containers.RepeatedCompositeFieldContainer[PendingMemoryWrite]
    max_entries: int
    max_chars: int
    chars: int
    def __init__(self, revision: _Optional[int] = ..., entries: _Optional[_Iterable[_Union[MemoryEntry, _Mapping]]] = ..., pending: _Optional[_Iterable[_Union[PendingMemoryWrite, _Mapping]]] = ..., max_entries: _Optional[int] = ..., max_chars: _Optional[int] = ..., chars: _Optional[int] = ...) -> None: ...

class EditMemoryRequest(_message.Message):
    __slots__ = ("action", "text", "entry_id", "old_text", "expected_revision", "session_id", "hold")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    OLD_TEXT_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_REVISION_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    HOLD_FIELD_NUMBER: _ClassVar[int]
    action: MemoryAction
    text: str
    entry_id: int
    old_text: str
    expected_revision: int
    session_id: str
    hold: bool
    def __init__(self, action: _Optional[_Union[MemoryAction, str]] = ..., text: _Optional[str] = ..., entry_id: _Optional[int] = ..., old_text: _Optional[str] = ..., expected_revision: _Optional[int] = ..., session_id: _Optional[str] = ..., hold: _Optional[bool] = ...) -> None: ...

class EditMemoryResponse(_message.Message):
    __slots__ = ("revision", "entry", "held")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    revision: int
    entry: MemoryEntry
    held: PendingMemoryWrite
    def __init__(self, revision: _Optional[int] = ..., entry: _Optional[_Union[MemoryEntry, _Mapping]] = ..., held: _Optional[_Union[PendingMemoryWrite, _Mapping]] = ...) -> None: ...

class ApproveMemoryWriteRequest(_message.Message):
    __slots__ = ("id", "expected_revision")
    ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_REVISION_FIELD_NUMBER: _ClassVar[int]
    id: int
    expected_revision: int
    def __init__(self, id: _Optional[int] = ..., expected_revision: _Optional[int] = ...) -> None: ...

class ApproveMemoryWriteResponse(_message.Message):
    __slots__ = ("revision", "entry")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    revision: int
    entry: MemoryEntry
    def __init__(self, revision: _Optional[int] = ..., entry: _Optional[_Union[MemoryEntry, _Mapping]] = ...) -> None: ...

class RejectMemoryWriteRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    def __init__(self, id: _Optional[int] = ...) -> None: ...

class RejectMemoryWriteResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class IndexChunksRequest(_message.Message):
    __slots__ = ("session_id", "chunks")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    chunks: _containers.RepeatedCompositeFieldContainer[_common_pb2.RawChunk]
    def __init__(self, session_id: _Optional[str] = ..., chunks: _Optional[_Iterable[_Union[_common_pb2.RawChunk, _Mapping]]] = ...) -> None: ...

class IndexChunksResponse(_message.Message):
    __slots__ = ("indexed",)
    INDEXED_FIELD_NUMBER: _ClassVar[int]
    indexed: int
    def __init__(self, indexed: _Optional[int] = ...) -> None: ...

class Observation(_message.Message):
    __slots__ = ("model", "chars", "tokens", "observed_at", "exact")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CHARS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_AT_FIELD_NUMBER: _ClassVar[int]
    EXACT_FIELD_NUMBER: _ClassVar[int]
    model: str
    chars: int
    tokens: int
    observed_at: _timestamp_pb2.Timestamp
    exact: _common_pb2.PromptShape
    def __init__(self, model: _Optional[str] = ..., chars: _Optional[int] = ..., tokens: _Optional[int] = ..., observed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., exact: _Optional[_Union[_common_pb2.PromptShape, _Mapping]] = ...) -> None: ...

class RecordObservationRequest(_message.Message):
    __slots__ = ("observation",)
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    observation: Observation
    def __init__(self, observation: _Optional[_Union[Observation, _Mapping]] = ...) -> None: ...

class RecordObservationResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListObservationsRequest(_message.Message):
    __slots__ = ("model", "limit")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    model: str
    limit: int
    def __init__(self, model: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListObservationsResponse(_message.Message):
    __slots__ = ("observations",)
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    observations: _containers.RepeatedCompositeFieldContainer[Observation]
    def __init__(self, observations: _Optional[_Iterable[_Union[Observation, _Mapping]]] = ...) -> None: ...

class Baseline(_message.Message):
    __slots__ = ("tokens", "through_seq", "model", "context_truncated", "recorded_at")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    THROUGH_SEQ_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    RECORDED_AT_FIELD_NUMBER: _ClassVar[int]
    tokens: int
    through_seq: int
    model: str
    context_truncated: bool
    recorded_at: _timestamp_pb2.Timestamp
    def __init__(self, tokens: _Optional[int] = ..., through_seq: _Optional[int] = ..., model: _Optional[str] = ..., context_truncated: _Optional[bool] = ..., recorded_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class SetBaselineRequest(_message.Message):
    __slots__ = ("session_id", "baseline", "only_truncated_flag")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    BASELINE_FIELD_NUMBER: _ClassVar[int]
    ONLY_TRUNCATED_FLAG_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    baseline: Baseline
    only_truncated_flag: bool
    def __init__(self, session_id: _Optional[str] = ..., baseline: _Optional[_Union[Baseline, _Mapping]] = ..., only_truncated_flag: _Optional[bool] = ...) -> None: ...

class SetBaselineResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetBaselineRequest(_message.Message):
    __slots__ = ("session_id", "model", "token_digest", "view_budget", "with_counts")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TOKEN_DIGEST_FIELD_NUMBER: _ClassVar[int]
    VIEW_BUDGET_FIELD_NUMBER: _ClassVar[int]
    WITH_COUNTS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    model: str
    token_digest: str
    view_budget: int
    with_counts: bool
    def __init__(self, session_id: _Optional[str] = ..., model: _Optional[str] = ..., token_digest: _Optional[str] = ..., view_budget: _Optional[int] = ..., with_counts: _Optional[bool] = ...) -> None: ...

class GetBaselineResponse(_message.Message):
    __slots__ = ("baseline", "observations", "context_tokens")
    BASELINE_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    baseline: Baseline
    observations: _containers.RepeatedCompositeFieldContainer[Observation]
    context_tokens: ContextTokens
    def __init__(self, baseline: _Optional[_Union[Baseline, _Mapping]] = ..., observations: _Optional[_Iterable[_Union[Observation, _Mapping]]] = ..., context_tokens: _Optional[_Union[ContextTokens, _Mapping]] = ...) -> None: ...

class ContextTokens(_message.Message):
    __slots__ = ("counted_tokens", "counted_messages", "counted_tool_results", "counted_tool_calls", "uncounted", "revision", "counts")
    COUNTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COUNTED_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    COUNTED_TOOL_RESULTS_FIELD_NUMBER: _ClassVar[int]
    COUNTED_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    UNCOUNTED_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    counted_tokens: int
    counted_messages: int
    counted_tool_results: int
    counted_tool_calls: int
    uncounted: _containers.RepeatedCompositeFieldContainer[_common_pb2.Message]
    revision: int
    counts: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenCount]
    def __init__(self, counted_tokens: _Optional[int] = ..., counted_messages: _Optional[int] = ..., counted_tool_results: _Optional[int] = ..., counted_tool_calls: _Optional[int] = ..., uncounted: _Optional[_Iterable[_Union[_common_pb2.Message, _Mapping]]] = ..., revision: _Optional[int] = ..., counts: _Optional[_Iterable[_Union[_common_pb2.TokenCount, _Mapping]]] = ...) -> None: ...

class SetTokenCountsRequest(_message.Message):
    __slots__ = ("session_id", "token_digest", "counts")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_DIGEST_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    token_digest: str
    counts: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenCount]
    def __init__(self, session_id: _Optional[str] = ..., token_digest: _Optional[str] = ..., counts: _Optional[_Iterable[_Union[_common_pb2.TokenCount, _Mapping]]] = ...) -> None: ...

class SetTokenCountsResponse(_message.Message):
    __slots__ = ("updated",)
    UPDATED_FIELD_NUMBER: _ClassVar[int]
    updated: int
    def __init__(self, updated: _Optional[int] = ...) -> None: ...

class SessionMessage(_message.Message):
    __slots__ = ("session_id", "origin", "payload")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    origin: str
    payload: bytes
    def __init__(self, session_id: _Optional[str] = ..., origin: _Optional[str] = ..., payload: _Optional[bytes] = ...) -> None: ...

class PublishSessionMessagesRequest(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[SessionMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[SessionMessage, _Mapping]]] = ...) -> None: ...

class PublishSessionMessagesResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListenSessionMessagesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListenSessionMessagesResponse(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[SessionMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[SessionMessage, _Mapping]]] = ...) -> None: ...
