"""`cubic campaign dashboard NAME` serves optuna-dashboard on the campaign's storage: it prints the
URL, answers on loopback, and stops on SIGINT; an unknown campaign is exit 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request

import optuna
import pytest

pytest.importorskip("optuna_dashboard")

from cubic.codesign.storage import META_KEY  # noqa: E402


def _cubic(*args, **kw):
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    return subprocess.Popen([sys.executable, "-m", "cubic.cli", "campaign", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, **kw)


def test_dashboard_serves_the_campaign_and_stops(tmp_path):
    url = f"sqlite:///{tmp_path / 'c.db'}"
    study = optuna.create_study(study_name="demo", storage=url)
    study.set_user_attr(META_KEY, {"version": 1, "name": "demo"})
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    p = _cubic("dashboard", "demo", "--storage", url, "--port", "0")
    try:
        line = p.stdout.readline()
        assert "http://127.0.0.1:" in line and "/dashboard/studies/" in line
        base = line.split("http://", 1)[1].split("/", 1)[0]
        with urllib.request.urlopen(f"http://{base}/api/studies", timeout=30) as r:
            body = json.loads(r.read())
        assert r.status == 200 and '"demo"' in json.dumps(body)
        with urllib.request.urlopen(line.split(": ", 1)[1].split()[0], timeout=30) as r:
            assert r.status == 200
    finally:
        p.send_signal(signal.SIGINT)
        assert p.wait(30) == 0


@pytest.mark.slow  # 11 s; serving and stopping stays in make test
def test_dashboard_stops_on_sigterm_and_on_sigint_when_started_with_sigint_ignored(tmp_path):
    # a shell's background job starts with SIGINT ignored, and Python keeps it so
    url = f"sqlite:///{tmp_path / 'c.db'}"
    optuna.create_study(study_name="demo", storage=url).set_user_attr(META_KEY, {"version": 1, "name": "demo"})
    for sig in (signal.SIGINT, signal.SIGTERM):
        p = _cubic("dashboard", "demo", "--storage", url, "--port", "0",
                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        try:
            assert "http://127.0.0.1:" in p.stdout.readline()
        finally:
            p.send_signal(sig)
            try:
                rc = p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                raise
        assert rc == 0, (sig, p.stderr.read())


def test_dashboard_unknown_campaign_exit_2(tmp_path):
    url = f"sqlite:///{tmp_path / 'c.db'}"
    optuna.create_study(study_name="other", storage=url)
    p = _cubic("dashboard", "nope", "--storage", url, "--port", "0")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "nope" in err and len(err.strip().splitlines()) == 1
