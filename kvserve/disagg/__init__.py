"""Prefill/decode (PD) disaggregation: one worker computes prompts, another decodes.

The protocol (vLLM's proxy order, SGLang's flag names), driven by ``kvserve route --pd``:

    client ──> router ──(1) body, stream off──────────────> prefill worker
                      <──   1 token + usage + kv_transfer_params {remote_host, remote_port,
                            remote_room, remote_backend}
                      ──(2) body + kv_transfer_params ────> decode worker ──(3) fetch room──>
                                                                           prefill bootstrap port
                      <──   the client's stream / answer ─┘  <── header + KV pages ──┘

(1) The prefill engine runs the prompt (prefix-cache hits included) with max_tokens 1. When
    the step that samples the first token completes, it copies the prompt's KV pages to host
    memory, keyed by the engine request id (the room), and only then lets the request finish:
    its pages go back to its radix cache at once. Its bootstrap server holds the copy until a
    decode engine fetches it, or drops it after ``--disaggregation-transfer-timeout``.
(2) The router sends the client's request to the decode worker with the prefill's
    ``kv_transfer_params``; the decode worker tokenizes the same way and hands the engine the
    remote handle.
(3) The decode engine fetches the room over the transfer backend (header: prompt ids, first
    token and its logprobs, the prefill's cached-token count, page shape, dtype, FP8 scales)
    into host memory, with a bounded wait. Only then does it take pages from its pool, import
    the KV and join the running batch with the first token known, as if it had prefilled;
    decoding continues from there. It holds no page while it waits, so a prefill that dies
    costs it nothing but the request (answered with an OpenAI error).

``usage.prompt_tokens_details.cached_tokens`` reported by the decode worker is the prefill
side's hit count, carried in the header. Failures: the router answers a prefill error or
disconnect with an OpenAI error (or retries another pair when retries are on); a decode
worker that dies mid-stream ends the stream with an error event; the prefill drops a copy
whose fetch broke. ``transfer.py`` is the backend seam (NIXL, Mooncake, plain TCP)."""
