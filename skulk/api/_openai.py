"""The OpenAI Chat Completions and Completions formats, sans-IO.

Request validation (:func:`parse_chat_completions`, :func:`parse_completions`), response and
stream-chunk formatting, SSE framing and the error envelope (:class:`ApiError`). No HTTP here:
the Quart app reads the body, calls a ``parse_*`` function, talks to the cluster, and writes what
the formatting functions return.

The code lives in ``_errors`` / ``_openai_parse`` / ``_openai_format``; import it from here.
"""

from skulk.api._errors import ApiError
from skulk.api._openai_format import (
    CHAT_ID_PREFIX,
    COMPLETION_ID_PREFIX,
    SSE_DONE,
    ChatStream,
    CompletionStream,
    OpenAIFinishReason,
    chat_chunk,
    chat_completion,
    chat_content_chunk,
    chat_finish_chunk,
    chat_role_chunk,
    chat_usage_chunk,
    completion,
    completion_chunk,
    completion_usage_chunk,
    new_request_id,
    openai_finish_reason,
    usage_object,
)
from skulk.api._openai_parse import (
    COMPLETIONS_DEFAULT_MAX_TOKENS,
    ChatCompletionsRequest,
    CompletionsRequest,
    parse_chat_completions,
    parse_completions,
)
from skulk.api._sse import sse_event

__all__ = [
    "CHAT_ID_PREFIX",
    "COMPLETIONS_DEFAULT_MAX_TOKENS",
    "COMPLETION_ID_PREFIX",
    "SSE_DONE",
    "ApiError",
    "ChatCompletionsRequest",
    "ChatStream",
    "CompletionStream",
    "CompletionsRequest",
    "OpenAIFinishReason",
    "chat_chunk",
    "chat_completion",
    "chat_content_chunk",
    "chat_finish_chunk",
    "chat_role_chunk",
    "chat_usage_chunk",
    "completion",
    "completion_chunk",
    "completion_usage_chunk",
    "new_request_id",
    "openai_finish_reason",
    "parse_chat_completions",
    "parse_completions",
    "sse_event",
    "usage_object",
]
