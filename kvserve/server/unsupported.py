"""Request fields kvserve knows of but does not implement, with the reason a 400 gives. A
field in no model and not listed here is refused as unknown; none is silently ignored."""

from __future__ import annotations

_STRUCTURED = "structured output (guided decoding) is not implemented"

REASONS: dict[str, str] = {
    "response_format": f"only response_format {{'type': 'text'}} is supported: {_STRUCTURED}",
    "guided_json": _STRUCTURED,
    "guided_regex": _STRUCTURED,
    "guided_choice": _STRUCTURED,
    "guided_grammar": _STRUCTURED,
    "guided_decoding_backend": _STRUCTURED,
    "structured_outputs": _STRUCTURED,
    "logit_bias": "logit_bias is not implemented",
    "best_of": "best_of other than n is not implemented",
    "use_beam_search": "beam search is not implemented",
    "length_penalty": "beam search is not implemented",
    "prompt_logprobs": "prompt logprobs are not implemented",
    "logits_processors": "custom logits processors are not supported",
    "allowed_token_ids": "allowed_token_ids is not implemented",
    "bad_words": "bad_words is not implemented",
    "truncate_prompt_tokens": "prompt truncation is not implemented",
    "functions": "the legacy functions field is not supported: use tools",
    "function_call": "the legacy function_call field is not supported: use tool_choice",
    "parallel_tool_calls": "parallel_tool_calls false is not implemented",
    "audio": "audio is not supported: kvserve serves text-only models",
    "modalities": "only text output is supported",
    "prediction": "predicted outputs are not implemented",
    "web_search_options": "web search is not supported",
    "continue_final_message": "continue_final_message is not implemented",
    "chat_template": "a request-supplied chat template is not accepted",
    "documents": "documents are not supported",
    "mm_processor_kwargs": "kvserve serves text-only models",
    "content": "only text content parts are supported: kvserve serves text-only models",
}


def reason(field: str) -> str:
    return REASONS.get(field, f"unknown field {field!r}: kvserve does not implement it")
