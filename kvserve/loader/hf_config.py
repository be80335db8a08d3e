"""``config.json`` of an HF checkpoint -> ``ModelConfig``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvserve.config import ModelConfig
from kvserve.errors import ConfigError, ModelLoadError
from kvserve.hf_sliding_window import sliding_window_of
from kvserve.loader.architectures import check_supported
from kvserve.loader.files import read_json_object
from kvserve.loader.generation_defaults import eos_ids_of, read_generation_defaults
from kvserve.loader.hf_moe_config import moe_config_of, qk_norm_of, rotary_dim_of
from kvserve.loader.mixtral_names import decoder_quantization


def read_hf_config(directory: Path) -> ModelConfig:
    path = directory / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"{directory}: no config.json (not an HF model directory)")
    data = read_json_object(path)
    modelopt = directory / "hf_quant_config.json"  # ModelOpt exports before quantization_config
    if "quantization_config" not in data and modelopt.is_file():
        data["quantization_config"] = {"quant_method": "modelopt", **read_json_object(modelopt)}
    eos = read_generation_defaults(directory).eos_token_ids
    try:
        return hf_config_to_model_config(data, eos_token_ids=eos)
    except ModelLoadError as exc:
        raise ModelLoadError(f"{path}: {exc}") from exc
    except KeyError as exc:
        raise ModelLoadError(f"{path}: invalid model config: missing key {exc}") from exc
    except (TypeError, ValueError) as exc:
        raise ModelLoadError(f"{path}: invalid model config: {exc}") from exc


def hf_config_to_model_config(
    data: dict[str, Any], eos_token_ids: tuple[int, ...] = ()
) -> ModelConfig:
    architectures = data.get("architectures") or []
    if not architectures:
        raise ModelLoadError("config has no `architectures` entry")
    architecture = check_supported(architectures[0], "config.json")
    hidden = int(data["hidden_size"])
    heads = int(data["num_attention_heads"])
    head_dim = int(data.get("head_dim") or hidden // heads)
    rope_theta, rope_scaling = _rope(data)
    if not eos_token_ids:
        eos_token_ids = eos_ids_of(data.get("eos_token_id"))
    try:
        return ModelConfig(
            architecture=architecture,
            vocab_size=int(data["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(data["intermediate_size"]),
            num_layers=int(data["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(data.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            rms_norm_eps=float(data.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=int(data.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(data.get("tie_word_embeddings", False)),
            # Qwen2 always has q/k/v biases; its config does not say so.
            attention_bias=architecture == "Qwen2ForCausalLM"
            or bool(data.get("attention_bias", False)),
            qk_norm=qk_norm_of(data, architecture),
            hidden_act=str(data.get("hidden_act", "silu")),
            bos_token_id=data.get("bos_token_id"),
            eos_token_ids=eos_token_ids,
            quantization=_quantization(data, architecture),
            moe=moe_config_of(data, architecture),
            rotary_dim=rotary_dim_of(data, head_dim),
            sliding_window=sliding_window_of(data, architecture),
        )
    except ConfigError as exc:
        raise ModelLoadError(str(exc)) from exc


def _quantization(data: dict[str, Any], architecture: str) -> dict[str, Any] | None:
    qc = data.get("quantization_config")
    return decoder_quantization(qc) if architecture == "MixtralForCausalLM" else qc


def _rope(data: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(theta, scaling dict or None) from `rope_theta`/`rope_scaling` or transformers 5's
    `rope_parameters`; the scaling type is always under the key `rope_type`."""
    params = dict(data.get("rope_parameters") or {})
    theta = float(data.get("rope_theta") or params.pop("rope_theta", None) or 10000.0)
    params.pop("rope_theta", None)
    scaling = dict(data.get("rope_scaling") or params)
    if "type" in scaling:
        scaling.setdefault("rope_type", scaling.pop("type"))
    if not scaling or scaling.get("rope_type", "default") == "default":
        return theta, None
    return theta, scaling
