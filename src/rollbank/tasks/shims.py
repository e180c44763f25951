r"""Offline verifier shims: make real Harbor / Terminal-Bench test scripts run without internet.

Owns: the exact set of programs the verifier writes into ``/opt/rollbank-verifier/bin``
(put first on the test command's PATH) after the agent finished. Real test scripts do::

    apt-get update; apt-get install -y curl
    curl -LsSf https://astral.sh/uv/0.9.7/install.sh | sh; source $HOME/.local/bin/env
    uvx --with pytest==8.4.1 --with pytest-json-ctrf==0.3.5 pytest --ctrf ... -rA
    # or (Terminal-Bench 1): uv venv .tbench-testing; source .tbench-testing/bin/activate;
    #                        uv pip install pytest==8.4.1; uv run pytest $TEST_DIR/... -rA

What is shimmed (nothing else is rewritten; the test script itself is never edited)
- ``apt-get``: ``update`` prints a note and succeeds; ``install`` succeeds when every named
  package is already installed (``dpkg-query``), else runs the real apt-get, which fails
  offline: then ``/logs/verifier/rollbank-shim-error.txt`` records it and the verifier run
  is an infrastructure failure (``verifier_crash``), whatever reward the script writes next.
- ``curl`` / ``wget``: a request for the astral.sh uv installer (``astral.sh/uv`` or
  ``.../uv/.../install.sh``) returns a small installer script instead, which links ``uv``/
  ``uvx`` into ``$HOME/.local/bin`` and writes ``$HOME/.local/bin/env`` and ``$HOME/.cargo/env``
  (add that directory to PATH, as uv's own installers do). Every other request runs the real program.
- ``uv`` / ``uvx``: ``uvx``/``uv tool run`` [``--with REQ``...] TOOL ARGS and ``uv run``:
  requirements already installed (any version; a different version is reported on stderr) are
  dropped, missing ones go to ``python3 -m pip install`` (fails offline: recorded in
  ``rollbank-shim-error.txt`` as above, so a missing verifier dependency is infra, not a zero
  reward), then TOOL runs (``pytest`` as ``python3 -m pytest``). ``uv venv DIR`` = ``python3 -m venv
  --system-site-packages --without-pip`` (so the base's pytest is visible); ``uv pip install``
  and ``uv add`` = the same requirement filtering; ``uv init``/``sync``/``lock``/``python``/``cache``
  do nothing.
- ``pip`` / ``pip3``: ``install`` with the same filtering, else ``python3 -m pip``.
- ``rollbank-tb1-verify CMD...``: runs CMD, keeps its output in
  ``/logs/verifier/test-output.txt``, parses pytest's ``-rA`` summary and writes
  ``/logs/verifier/reward.txt`` (1 if a test passed and none failed or errored; nothing when
  no summary was found, which the verifier reports as verifier_no_reward).

The base image provides pytest (Debian's, 7.2) and pytest-json-ctrf 0.3.5 (see
:mod:`rollbank.tasks.bases`). Every shim announces itself on stderr with ``[rollbank shim]``.
"""

from __future__ import annotations

SHIM_DIR = "/opt/rollbank-verifier/bin"

_UV = r'''#!/usr/bin/env python3
"""rollbank offline uv/uvx/pip shim (see rollbank.tasks.shims)."""
import importlib.metadata as md, os, re, shutil, subprocess, sys

def note(msg): print(f"[rollbank shim] {msg}", file=sys.stderr, flush=True)

def dist_name(req):
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
    return m.group(1) if m else None

def ensure(reqs):
    missing = []
    for req in reqs:
        req = req.strip()
        if not req or req.startswith("-"):
            continue
        name = dist_name(req.replace("@", "==", 1) if "@" in req and "://" not in req else req)
        try:
            have = md.version(name) if name else None
        except md.PackageNotFoundError:
            have = None
        if have is None:
            missing.append(req)
        else:
            want = req[len(name):].strip()
            if want and want.lstrip("=") != have:
                note(f"{req}: using installed {name} {have}")
    if missing:
        note(f"installing {missing} with pip (offline: this fails unless a local index is set)")
        rc = subprocess.call([sys.executable, "-m", "pip", "install", "-q", "--retries", "0",
                              "--timeout", "10", *missing])
        if rc:
            infra_error(f"verifier requirements not installable offline: {' '.join(missing)}")
            sys.exit(rc)

def infra_error(msg):
    """Mark the verifier run as an infrastructure failure (read by rollbank's verifier)."""
    note(msg)
    logs = os.environ.get("ROLLBANK_VERIFIER_LOGS", "/logs/verifier")
    try:
        os.makedirs(logs, exist_ok=True)
        with open(os.path.join(logs, "rollbank-shim-error.txt"), "a") as f:
            f.write(msg + "\n")
    except OSError:
        pass

def reqs_of(files):
    out = []
    for f in files:
        with open(f) as fh:
            out += [l.split("#")[0].strip() for l in fh if l.split("#")[0].strip()]
    return out

VALUE_OPTS = {"--python", "-p", "--directory", "--project", "--from", "--index-url", "-i",
              "--extra-index-url", "--cache-dir", "--python-preference", "--index", "--group",
              "--extra", "--env-file", "--constraint", "-c", "--prefix", "--target", "--color"}

ALIASES = {"-w": "--with", "--python": "-p"}

def split_opts(args, collect=("--with",)):
    """Leading options of a uv command -> ({opt: [values]}, rest)."""
    opts, i = {}, 0
    while i < len(args) and args[i].startswith("-") and args[i] != "--":
        a = args[i]
        name, eq, val = a.partition("=")
        name = ALIASES.get(name, name)
        if name in collect or name in VALUE_OPTS or name in ("-r", "--requirement", "--with-requirements"):
            if not eq:
                i += 1
                val = args[i] if i < len(args) else ""
            opts.setdefault(name, []).append(val)
        i += 1
    if i < len(args) and args[i] == "--":
        i += 1
    return opts, args[i:]

def run_tool(argv):
    if not argv:
        note("nothing to run"); sys.exit(2)
    tool = argv[0]
    if tool in ("pytest", "py.test"):
        os.execvp(sys.executable, [sys.executable, "-m", "pytest", *argv[1:]])
    if tool in ("python", "python3") and shutil.which(tool) is None:
        os.execvp(sys.executable, [sys.executable, *argv[1:]])
    if tool.endswith(".py"):
        os.execvp(sys.executable, [sys.executable, *argv])
    os.execvp(tool, argv)

def with_reqs(opts):
    reqs = [r for v in opts.get("--with", []) for r in v.split(",")]
    return reqs + reqs_of(opts.get("--with-requirements", []))

def tool_run(args):
    opts, rest = split_opts(args)
    reqs = with_reqs(opts)
    if rest:
        tool = dist_name(rest[0]) or rest[0]
        src = (opts.get("--from") or [rest[0]])[0]
        reqs.append(src if src != rest[0] else re.sub(r"@", "==", rest[0], count=1))
        rest = [tool, *rest[1:]]
    ensure(reqs)
    run_tool(rest)

def pip(args):
    if args and args[0] == "install":
        opts, rest = split_opts(args[1:], collect=())
        reqs = [a for a in rest if not a.startswith("-")] + reqs_of(opts.get("-r", []) + opts.get("--requirement", []))
        ensure(reqs); return
    if args and args[0] in ("uninstall",):
        note("uv pip uninstall ignored"); return
    os.execvp(sys.executable, [sys.executable, "-m", "pip", *args])

def main():
    prog = os.path.basename(sys.argv[0])
    args = sys.argv[1:]
    if prog == "uvx":
        return tool_run(args)
    if prog in ("pip", "pip3"):
        return pip(args)
    while args and args[0] in ("-q", "--quiet", "-v", "--verbose", "--offline", "--no-cache", "-n", "--native-tls"):
        args = args[1:]
    if not args or args[0] in ("--version", "-V", "version", "self"):
        print("uv 0.0.0 (rollbank offline shim)"); return
    cmd, rest = args[0], args[1:]
    if cmd == "tool" and rest[:1] == ["run"]:
        return tool_run(rest[1:])
    if cmd == "tool" and rest[:1] == ["install"]:
        return ensure([r for r in rest[1:] if not r.startswith("-")])
    if cmd == "venv":
        opts, pos = split_opts(rest, collect=())
        path = pos[0] if pos else ".venv"
        note(f"uv venv {path}: python3 -m venv --system-site-packages (offline)")
        sys.exit(subprocess.call([sys.executable, "-m", "venv", "--clear", "--system-site-packages", "--without-pip", path]))
    if cmd == "pip":
        return pip(rest)
    if cmd == "add":
        opts, pos = split_opts(rest, collect=())
        return ensure(pos)
    if cmd in ("init", "sync", "lock", "python", "cache"):
        note(f"uv {cmd} skipped (offline)"); return
    if cmd == "run":
        opts, pos = split_opts(rest)
        ensure(with_reqs(opts))
        return run_tool(pos)
    note(f"uv {cmd} is not supported offline"); sys.exit(2)

main()
'''

_APT = r'''#!/bin/sh
# rollbank offline apt-get shim (see rollbank.tasks.shims)
case "$1" in
  update) echo "[rollbank shim] apt-get update skipped (offline)" >&2; exit 0;;
  install)
    shift; missing=""
    for p in "$@"; do
      case "$p" in -*) continue;; esac
      p="${p%%=*}"
      dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
    done
    if [ -z "$missing" ]; then echo "[rollbank shim] apt-get install: already installed" >&2; exit 0; fi
    echo "[rollbank shim] apt-get install:$missing not installed; trying the real apt-get (offline)" >&2
    /usr/bin/apt-get install "$@" && exit 0
    logs="${ROLLBANK_VERIFIER_LOGS:-/logs/verifier}"; mkdir -p "$logs"
    echo "verifier packages not installable offline:$missing" >> "$logs/rollbank-shim-error.txt"
    exit 100;;
esac
exec /usr/bin/apt-get "$@"
'''

_INSTALLER = r'''#!/bin/sh
# rollbank offline stand-in for the astral.sh uv installer
mkdir -p "$HOME/.local/bin"
ln -sf __SHIMS__/uv "$HOME/.local/bin/uv"
ln -sf __SHIMS__/uvx "$HOME/.local/bin/uvx"
cat > "$HOME/.local/bin/env" <<'EOF'
#!/bin/sh
case ":${PATH}:" in *:"$HOME/.local/bin":*) ;; *) export PATH="$HOME/.local/bin:$PATH";; esac
EOF
mkdir -p "$HOME/.cargo" && cp "$HOME/.local/bin/env" "$HOME/.cargo/env"
echo "[rollbank shim] uv installer replaced by the offline shim" >&2
'''

_FETCH = r'''#!/bin/sh
# rollbank offline __NAME__ shim (see rollbank.tasks.shims)
for a in "$@"; do
  case "$a" in
    *astral.sh/uv*|*/uv/*install.sh|*astral.sh/*install.sh)
      out=""; prev=""
      for b in "$@"; do
        case "$prev" in -o|--output|-O) out="$b";; esac
        case "$b" in --output=*) out="${b#--output=}";; esac
        prev="$b"
      done
      if [ -n "$out" ] && [ "$out" != "-" ]; then cat __SHIMS__/uv-installer.sh > "$out"; else cat __SHIMS__/uv-installer.sh; fi
      exit 0;;
  esac
done
exec __REAL__ "$@"
'''

_TB1 = r'''#!/usr/bin/env python3
"""rollbank-tb1-verify: run a Terminal-Bench 1 test command, turn pytest -rA into a reward."""
import os, re, subprocess, sys
LOGS = os.environ.get("ROLLBANK_VERIFIER_LOGS", "/logs/verifier")
os.makedirs(LOGS, exist_ok=True)
with open(os.path.join(LOGS, "test-output.txt"), "wb") as log:
    p = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    data = b""
    for chunk in iter(lambda: p.stdout.read1(65536), b""):
        sys.stdout.buffer.write(chunk); sys.stdout.flush(); log.write(chunk); data += chunk
    rc = p.wait()
text = data.decode("utf-8", "replace")
summary = text.split("short test summary info", 1)
status = re.findall(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED)\b", summary[1] if len(summary) > 1 else "", re.M)
if not status:
    print(f"[rollbank shim] no pytest -rA summary found (exit {rc}); no reward written", file=sys.stderr)
    sys.exit(rc or 1)
ok = "PASSED" in status and not ({"FAILED", "ERROR"} & set(status))
with open(os.path.join(LOGS, "reward.txt"), "w") as f:
    f.write("1\n" if ok else "0\n")
print(f"[rollbank shim] tests: {len(status)} results, reward {1 if ok else 0}", file=sys.stderr)
sys.exit(0)
'''


_BUILD_INSTALLER = r'''#!/bin/sh
# rollbank build-time stand-in for the astral.sh uv installer: uv from PyPI instead
set -e
python3 -m pip install -q --no-cache-dir --disable-pip-version-check "uv__UV_PIN__"
mkdir -p "$HOME/.local/bin"
ln -sf "$(command -v uv)" "$HOME/.local/bin/uv"
ln -sf "$(command -v uvx)" "$HOME/.local/bin/uvx"
cat > "$HOME/.local/bin/env" <<'EOF'
#!/bin/sh
case ":${PATH}:" in *:"$HOME/.local/bin":*) ;; *) export PATH="$HOME/.local/bin:$PATH";; esac
EOF
mkdir -p "$HOME/.cargo" && cp "$HOME/.local/bin/env" "$HOME/.cargo/env"
echo "[rollbank shim] uv installed from PyPI instead of astral.sh" >&2
'''

_BUILD_FETCH = r'''#!/bin/sh
# rollbank build-time __NAME__ shim: only the astral.sh uv installer is replaced
for a in "$@"; do
  case "$a" in
    *astral.sh/uv*|*/uv/*install.sh|*astral.sh/*install.sh)
      ver="$(printf '%s' "$a" | sed -n 's#.*/uv/\([0-9][0-9.]*\)/install.sh.*#\1#p')"
      pin=""; [ -n "$ver" ] && pin="==$ver"
      out=""; prev=""
      for b in "$@"; do
        case "$prev" in -o|--output|-O) out="$b";; esac
        case "$b" in --output=*) out="${b#--output=}";; esac
        prev="$b"
      done
      if [ -n "$out" ] && [ "$out" != "-" ]; then exec >"$out"; fi
      sed "s/__UV_PIN__/$pin/" __SHIMS__/uv-installer.sh
      exit 0;;
  esac
done
for d in /usr/local/bin /usr/bin /bin; do [ -x "$d/__NAME__" ] && exec "$d/__NAME__" "$@"; done
echo "__NAME__: not found" >&2; exit 127
'''

#: Where the build sandbox binds :func:`build_shim_files` (``/dev`` is a fresh tmpfs in the
#: build sandbox, so the mount point never reaches a layer); first on every RUN step's PATH.
BUILD_SHIM_DIR = "/dev/.rollbank-build-shims"


def build_shim_files() -> dict[str, tuple[bytes, int]]:
    """Shims on PATH during RUN steps: ``curl``/``wget`` of the astral.sh uv installer install
    uv from PyPI instead (the build sandbox reaches PyPI, not astral.sh); every other request
    goes to the real program."""

    def fill(text: str, name: str = "") -> bytes:
        return text.replace("__SHIMS__", BUILD_SHIM_DIR).replace("__NAME__", name).encode()

    return {"curl": (fill(_BUILD_FETCH, "curl"), 0o755), "wget": (fill(_BUILD_FETCH, "wget"), 0o755),
            "uv-installer.sh": (fill(_BUILD_INSTALLER), 0o755)}


def shim_files() -> dict[str, tuple[bytes, int]]:
    """name -> (content, mode) of every file written into :data:`SHIM_DIR`."""

    def fill(text: str, **kw: str) -> bytes:
        text = text.replace("__SHIMS__", SHIM_DIR)
        for k, v in kw.items():
            text = text.replace(f"__{k}__", v)
        return text.encode()

    files = {
        "uv": (fill(_UV), 0o755), "uvx": (fill(_UV), 0o755), "pip": (fill(_UV), 0o755),
        "pip3": (fill(_UV), 0o755), "apt-get": (fill(_APT), 0o755),
        "uv-installer.sh": (fill(_INSTALLER), 0o755),
        "curl": (fill(_FETCH, NAME="curl", REAL="/usr/bin/curl"), 0o755),
        "wget": (fill(_FETCH, NAME="wget", REAL="/usr/bin/wget"), 0o755),
        "rollbank-tb1-verify": (fill(_TB1), 0o755),
    }
    return files
