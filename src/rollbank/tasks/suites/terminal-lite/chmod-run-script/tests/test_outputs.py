# The agent's /app/run.sh runs in a child process as nobody, never as root here: it cannot
# write /logs/verifier or signal this runner, so it cannot forge the reward.
import os, shutil, subprocess, tempfile

NOBODY = 65534


def test_executable():
    assert os.access("/app/run.sh", os.X_OK)
    # root ran any file with an x bit: nobody runs a root-owned copy of its bytes, mode 0755,
    # in a directory the child cannot write
    d = tempfile.mkdtemp()
    os.chmod(d, 0o755)
    script = os.path.join(d, "run.sh")
    shutil.copyfile("/app/run.sh", script)
    os.chmod(script, 0o755)
    home = tempfile.mkdtemp()
    os.chown(home, NOBODY, NOBODY)
    out = subprocess.run([script], user=NOBODY, group=NOBODY, extra_groups=[], cwd=home,
                         env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home},
                         capture_output=True, text=True, timeout=10)
    assert out.returncode == 0
    assert out.stdout.strip() == "run ok: 42"
