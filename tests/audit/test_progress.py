"""Progress written to a file or a CI log is plain lines; on a terminal the bars are drawn as before."""
import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios

REDRAW = re.compile(r"\r|\x1b\[")
RUN = ["-m", "audit", "run", "--models", "cnn-sgd", "--methods", "gradient,random", "--tests", "random-logit",
       "--n-images", "4"]


def _on_terminal(args: list[str]) -> str:
    """What the command writes to a terminal (stdout and stderr both a pseudo-terminal)."""
    lead, follower = pty.openpty()
    # a pseudo-terminal starts 0 columns wide, and tqdm would draw bars of no width
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    process = subprocess.Popen([sys.executable, *args], stdout=follower, stderr=follower, stdin=subprocess.DEVNULL,
                               env=os.environ)
    os.close(follower)
    chunks = []
    while True:
        ready, _, _ = select.select([lead], [], [], 300)
        if not ready:
            process.kill()
            raise AssertionError("the command wrote nothing for 300 s")
        try:
            chunk = os.read(lead, 65536)
        except OSError:  # the terminal closed: the command ended
            break
        if not chunk:
            break
        chunks.append(chunk)
    assert process.wait(timeout=60) == 0
    os.close(lead)
    return b"".join(chunks).decode(errors="replace")


def test_a_run_logged_to_a_file_is_one_plain_line_per_unit_and_per_report_stage(tmp_path):
    done = subprocess.run([sys.executable, *RUN, "--out", str(tmp_path / "run")], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    text = done.stdout + done.stderr
    assert not REDRAW.search(text), repr(text[:2000])
    units = [line for line in done.stdout.splitlines() if line.startswith("cnn-sgd/random-logit/")]
    assert [u.split(":")[0] for u in units] == ["cnn-sgd/random-logit/gradient", "cnn-sgd/random-logit/random"]
    assert sum(line.startswith("report: ") for line in done.stdout.splitlines()) >= 3


def test_a_terminal_keeps_its_bars_and_quiet_leaves_them_out(tmp_path):
    drawn = _on_terminal([*RUN, "--no-report", "--out", str(tmp_path / "bars")])
    assert REDRAW.search(drawn) and "audit:" in drawn
    quiet = _on_terminal([*RUN, "--no-report", "--quiet", "--out", str(tmp_path / "quiet")])
    assert not REDRAW.search(quiet.replace("\r\n", "\n")), repr(quiet[:2000])
    assert "cnn-sgd/random-logit/gradient:" in quiet
