# The agent's code (make on its Makefile, bin/engine) runs in a child process as nobody, in a
# copy of /app/engine: it cannot write /logs/verifier or signal this runner.
"""Generates the engine sources (used at build time and by the verifier to compute the answer)."""
import os, random, sys

N_MODS = 80
N_HELPERS = 60

def consts():
    r = random.Random(5150)
    return [[(r.getrandbits(32) | 1, r.getrandbits(32), r.randint(5, 19)) for _ in range(N_HELPERS)] for _ in range(N_MODS)]

def expected():
    M = 0xFFFFFFFF
    total = 0
    for i, hs in enumerate(consts()):
        x = i + 1
        for _ in range(3):
            for a, b, s in hs:
                x = (x * a + b) & M
                x ^= x >> s
        total = (total + x) & M
    return f"modules={N_MODS} checksum={total}"

def write(root):
    os.makedirs(f"{root}/src/mods", exist_ok=True)
    os.makedirs(f"{root}/include", exist_ok=True)
    with open(f"{root}/include/mods.h", "w") as f:
        f.write("#ifndef MODS_H\n#define MODS_H\n#include <stdint.h>\n")
        f.write(f"#define N_MODS {N_MODS}\n")
        for i in range(N_MODS):
            f.write(f"uint32_t mod_{i:03d}(uint32_t x);\n")
        f.write("extern uint32_t (*const MODS[N_MODS])(uint32_t);\n#endif\n")
    for i, hs in enumerate(consts()):
        with open(f"{root}/src/mods/mod_{i:03d}.c", "w") as f:
            f.write('#include "mods.h"\n\n')
            for k, (a, b, s) in enumerate(hs):
                f.write(f"static uint32_t h{k}(uint32_t x) {{\n    x = x * {a}u + {b}u;\n    x ^= x >> {s};\n    return x;\n}}\n\n")
            f.write(f"uint32_t mod_{i:03d}(uint32_t x) {{\n    for (int r = 0; r < 3; r++) {{\n")
            for k in range(N_HELPERS):
                f.write(f"        x = h{k}(x);\n")
            f.write("    }\n    return x;\n}\n")
    with open(f"{root}/src/table.c", "w") as f:
        f.write('#include "mods.h"\n\nuint32_t (*const MODS[N_MODS])(uint32_t) = {\n')
        f.write(",\n".join(f"    mod_{i:03d}" for i in range(N_MODS)) + "\n};\n")
    with open(f"{root}/src/main.c", "w") as f:
        f.write('#include <stdio.h>\n#include "mods.h"\n\nint main(void) {\n    uint32_t total = 0;\n'
                '    for (int i = 0; i < N_MODS; i++) total += MODS[i]((uint32_t)(i + 1));\n'
                '    printf("modules=%d checksum=%u\\n", N_MODS, total);\n    return 0;\n}\n')

if __name__ == "__main__":
    write(sys.argv[1])


import shutil, subprocess, tempfile
from pathlib import Path

NOBODY = 65534


def nobody_dir():
    d = tempfile.mkdtemp()
    os.chown(d, NOBODY, NOBODY)
    return d


def copy_engine():
    """A copy of /app/engine owned by nobody, in a fresh directory."""
    work = os.path.join(nobody_dir(), "engine")
    shutil.copytree("/app/engine", work, symlinks=True)
    for top, dirs, files in os.walk(work):
        for p in [top] + [os.path.join(top, n) for n in dirs + files]:
            os.chown(p, NOBODY, NOBODY, follow_symlinks=False)
    return work


def as_nobody(argv, cwd, home):
    return subprocess.run(argv, user=NOBODY, group=NOBODY, extra_groups=[], cwd=cwd,
                          env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home},
                          capture_output=True, text=True, timeout=30)

def test_output_file():
    assert Path("/app/engine_output.txt").read_text().strip() == expected()

def test_binary_and_makefile():
    work, home = copy_engine(), nobody_dir()
    r = as_nobody(["./bin/engine"], work, home)
    assert r.stdout.strip() == expected()
    plan = as_nobody(["make", "-n", "-B"], work, home)
    assert plan.returncode == 0, plan.stderr
    assert sum(1 for ln in plan.stdout.splitlines() if "src/mods/mod_" in ln and " -c " in ln) == N_MODS
    mod7 = Path("/app/engine/src/mods/mod_007.c").read_text()
    assert mod7.count("static uint32_t h") == N_HELPERS
