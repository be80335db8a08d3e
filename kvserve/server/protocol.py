"""OpenAI protocol request models (pydantic), bounded at the edge.

Every number is limited to what the engine can carry (a 400 naming the field otherwise); every
string is checked for lone surrogates; a field kvserve does not know or does not implement is a
400 that says so (``unsupported.py``), never silently ignored. Operator limits that depend on
flags (``n``, prompts per request, stop strings, prompt bytes) are checked in ``limits.py``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from kvserve.server import unsupported
from kvserve.server.text_checks import check_json_value, check_text

INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_STOP_STRING_CHARS = 1024
MAX_STOP_TOKEN_IDS = 1024
MAX_TOP_LOGPROBS = 20

Text = Annotated[str, AfterValidator(check_text)]
JSONObject = Annotated[dict[str, Any], AfterValidator(check_json_value)]
Count = Annotated[int, Field(ge=0, le=INT32_MAX)]
Prompt = Text | list[Text] | list[StrictInt] | list[list[StrictInt]]
StopString = Annotated[Text, Field(min_length=1, max_length=MAX_STOP_STRING_CHARS)]


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class StreamOptions(_Base):
    include_usage: bool = False


class SamplingFields(_Base):
    """Fields shared by both endpoints (OpenAI's plus vLLM's extras)."""

    model: Annotated[Text, Field(max_length=1024)] | None = None
    n: Annotated[int, Field(ge=1, le=INT32_MAX)] = 1
    best_of: Annotated[int, Field(ge=1, le=INT32_MAX)] | None = None
    temperature: Annotated[float, Field(ge=0)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=-1, le=INT32_MAX)] | None = None
    min_p: Annotated[float, Field(ge=0, le=1)] | None = None
    seed: Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)] | None = None
    stop: StopString | list[StopString] | None = None
    stop_token_ids: (
        Annotated[list[Annotated[StrictInt, Field(ge=0, le=INT32_MAX)]],
                  Field(max_length=MAX_STOP_TOKEN_IDS)] | None
    ) = None  # fmt: skip
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0)] | None = None
    logit_bias: dict[str, float] | None = None
    ignore_eos: bool = False
    min_tokens: Count = 0
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: Annotated[Text, Field(max_length=1024)] | None = None  # accepted, not used
    # Prefill/decode disaggregation (vLLM's field): where a decode worker fetches the KV.
    kv_transfer_params: JSONObject | None = None

    @field_validator("logit_bias")
    @classmethod
    def _empty_logit_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value:
            raise ValueError(unsupported.reason("logit_bias"))
        return value

    @field_validator("best_of")
    @classmethod
    def _best_of_is_n(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and value != info.data.get("n", 1):
            raise ValueError(unsupported.reason("best_of"))
        return value


class CompletionRequest(SamplingFields):
    prompt: Prompt
    max_tokens: Annotated[int, Field(ge=1, le=INT32_MAX)] | None = 16
    logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    echo: bool = False
    suffix: Text | None = None


class FunctionCall(_Base):
    name: Text
    arguments: Text = ""


class ToolCall(_Base):
    id: Text | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ContentPart(_Base):
    type: Literal["text"]
    text: Text


class ChatMessage(BaseModel):
    """Lenient about extra keys a client echoes back from a response (``refusal``,
    ``annotations``, ...) as long as they carry nothing."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[ContentPart] | None = None
    name: Text | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: Text | None = None
    reasoning_content: Text | None = None

    @model_validator(mode="after")
    def _empty_extras_only(self) -> ChatMessage:
        for key, value in (self.model_extra or {}).items():
            if value not in (None, [], {}, ""):
                raise ValueError(f"message field {key!r} is not supported by kvserve")
        return self


class FunctionDef(_Base):
    name: Text
    description: Text | None = None
    parameters: JSONObject | None = None
    strict: bool | None = None


class Tool(_Base):
    type: Literal["function"] = "function"
    function: FunctionDef


class ResponseFormat(_Base):
    type: Literal["text"]


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Annotated[int, Field(ge=1, le=INT32_MAX)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1, le=INT32_MAX)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | JSONObject | None = None
    parallel_tool_calls: Literal[True] | None = None
    response_format: ResponseFormat | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: JSONObject | None = None


class TokenizeRequest(_Base):
    model: Annotated[Text, Field(max_length=1024)] | None = None
    prompt: Text | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(_Base):
    model: Annotated[Text, Field(max_length=1024)] | None = None
    tokens: list[StrictInt]
