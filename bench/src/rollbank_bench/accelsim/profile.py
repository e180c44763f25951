"""Latency profiles of the accelsim benchmark engine: data files + the step-time model.

Owns :class:`LatencyProfile` (one TOML file under ``profiles/``, every number cited in the
file's ``source``) and :func:`load_profile`.

Step-time model (one continuous-batching step = one forward pass over the batch)::

    step_s = step_base_s
           + decode_per_seq_s       * decode_seqs
           + decode_per_ctx_token_s * decode_ctx_tokens   (KV read of every decoding sequence)
           + prefill_per_token_s    * prefill_tokens      (uncached prompt tokens in the step)
           + prefill_per_seq_s      * prefill_seqs
           + prefill_per_pair_s     * prefill_pairs       (attention: prefill token x earlier token)

``step_base_s`` is the memory-bound weight read (plus scheduler/launch overhead) paid by every
step; the per-sequence and per-context terms make decode grow slowly with batch until the KV
reads dominate; prefill is compute-bound, linear in uncached tokens, plus an attention term
quadratic in the prompt (each prefilled token attends to every earlier one, cached or not;
it dominates the tiny CPU model's long prompts). A cached prefix costs no prefill tokens. The engine caps each step at ``max_num_batched_tokens`` (decode tokens count 1 each,
as in vLLM V1's token budget) and ``max_num_seqs`` running sequences.

Instrument scales (both 1 in every profile file; set per run, e.g. ``bench collect
--trace-profile``, :mod:`rollbank_bench.traces`):

- ``token_scale`` k: each token the engine receives or emits stands for k tokens of the
  modelled agent (a coarse-grained token stream: prompts, outputs and the KV cache are k times
  shorter on the wire). A step that emits one token per decoding sequence stands for k decode
  steps of contexts k times longer; prefill charges k x the uncached tokens (k^2 x the
  attention pairs); the KV capacity and ``max_model_len`` are divided by k. The token budget
  per step is unchanged (k steps x budget real tokens = budget emitted tokens).
- ``time_scale`` c: every step lasts 1/c of its modelled time (time compression: an hour of
  the modelled accelerator in 60/c minutes of wall time).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from pydantic import Field

from rollbank.config import Section

PROFILE_DIR = Path(__file__).with_name("profiles")


class LatencyProfile(Section):
    """One accelerator (or the calibrated CPU server) as the engine emulates it."""

    name: str = Field(description="short profile name (the file stem)")
    source: str = Field(description="where every number comes from (citations, measurement command)")
    block_size: int = Field(default=16, ge=1, description="KV / prefix-cache block size in tokens")
    kv_capacity_tokens: int = Field(
        ge=1, description="KV cache size in tokens (running sequences + cached prefixes share it)"
    )
    max_num_seqs: int = Field(default=256, ge=1, description="max running sequences (vLLM --max-num-seqs)")
    max_num_batched_tokens: int = Field(
        default=8192, ge=1, description="token budget per step: decode tokens + prefill chunks"
    )
    max_model_len: int = Field(default=8192, ge=2, description="prompt + output tokens per request")
    vocab_size: int = Field(default=128256, ge=2, description="token ids are drawn in [0, vocab_size)")
    eos_token_id: int | None = Field(default=None, description="EOS id honoured like a stop id; None: none")
    step_base_s: float = Field(ge=0, description="fixed seconds per step (weight read + overhead)")
    decode_per_seq_s: float = Field(ge=0, description="seconds per decoding sequence in a step")
    decode_per_ctx_token_s: float = Field(
        ge=0, description="seconds per context token of the decoding sequences (KV read) in a step"
    )
    prefill_per_token_s: float = Field(ge=0, description="seconds per uncached prompt token in a step")
    prefill_per_seq_s: float = Field(default=0.0, ge=0, description="seconds per sequence prefilled in a step")
    prefill_per_pair_s: float = Field(
        default=0.0, ge=0, description="seconds per attention pair (prefilled token x earlier token) in a step"
    )
    token_scale: float = Field(
        default=1.0, ge=1.0,
        description="instrument: each engine token stands for this many modelled tokens (see module notes)",
    )
    time_scale: float = Field(
        default=1.0, gt=0.0,
        description="instrument: steps last 1/time_scale of their modelled time (time compression)",
    )

    @property
    def kv_capacity_blocks(self) -> int:
        return max(1, int(self.kv_capacity_tokens / self.token_scale) // self.block_size)

    def step_time(
        self,
        *,
        prefill_tokens: int = 0,
        prefill_seqs: int = 0,
        decode_seqs: int = 0,
        decode_ctx_tokens: int = 0,
        prefill_pairs: float = 0.0,
    ) -> float:
        """Seconds one step takes for this batch (0 for an empty batch)."""
        if prefill_tokens <= 0 and decode_seqs <= 0:
            return 0.0
        k, c = self.token_scale, self.time_scale
        if k != 1.0 or c != 1.0:
            return self._scaled_step(k, c, prefill_tokens, prefill_seqs, decode_seqs,
                                     decode_ctx_tokens, prefill_pairs)
        return (
            self.step_base_s
            + self.decode_per_seq_s * decode_seqs
            + self.decode_per_ctx_token_s * decode_ctx_tokens
            + self.prefill_per_token_s * prefill_tokens
            + self.prefill_per_seq_s * prefill_seqs
            + self.prefill_per_pair_s * prefill_pairs
        )

    def _scaled_step(self, k: float, c: float, prefill_tokens: int, prefill_seqs: int,
                     decode_seqs: int, decode_ctx_tokens: int, prefill_pairs: float) -> float:
        """One emitted step = k modelled decode steps (contexts k times longer) plus the
        prefill of k x the uncached tokens, compressed by c."""
        decode = 0.0
        if decode_seqs > 0:
            decode = k * (self.step_base_s + self.decode_per_seq_s * decode_seqs
                          + self.decode_per_ctx_token_s * k * decode_ctx_tokens)
        prefill = (self.prefill_per_token_s * k * prefill_tokens
                   + self.prefill_per_seq_s * prefill_seqs
                   + self.prefill_per_pair_s * k * k * prefill_pairs)
        if decode_seqs <= 0:
            prefill += self.step_base_s
        return (decode + prefill) / c


def profile_names() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))


def load_profile(name_or_path: str | Path) -> LatencyProfile:
    """A profile by name (``profiles/<name>.toml``) or by path to a TOML file."""
    named = PROFILE_DIR / f"{name_or_path}.toml"
    path = named if named.is_file() else Path(name_or_path)
    if not path.is_file():
        raise FileNotFoundError(f"no accelsim profile {name_or_path!r} (known: {', '.join(profile_names())})")
    data = tomllib.loads(path.read_text())
    data.setdefault("name", path.stem)
    return LatencyProfile.model_validate(data)


def with_overrides(profile: LatencyProfile, *, vocab_size: int | None = None,
                   max_model_len: int | None = None, token_scale: float | None = None,
                   time_scale: float | None = None) -> LatencyProfile:
    """``profile`` with a different vocabulary / context limit (the timing numbers are kept),
    or with instrument scales (module notes).

    An EOS id outside the new vocabulary is dropped (it could never be generated anyway). A
    ``token_scale`` without ``max_model_len`` divides the profile's context limit by it.
    """
    update: dict[str, object] = {}
    if token_scale is not None:
        update["token_scale"] = token_scale
        if max_model_len is None:
            update["max_model_len"] = max(2, int(profile.max_model_len / token_scale))
    if time_scale is not None:
        update["time_scale"] = time_scale
    if vocab_size is not None:
        update["vocab_size"] = vocab_size
        if profile.eos_token_id is not None and profile.eos_token_id >= vocab_size:
            update["eos_token_id"] = None
    if max_model_len is not None:
        update["max_model_len"] = max_model_len
    return LatencyProfile.model_validate({**profile.model_dump(), **update}) if update else profile
