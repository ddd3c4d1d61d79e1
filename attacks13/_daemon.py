"""Start one dev daemon (tests' fixture) for the attacks13 probes; writes its coordinates to JSON.

Usage: python attacks13/_daemon.py STATE_DIR [key=value-json ...]  (runs until killed)
"""
import json, signal, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.conftest import start_daemon, stop_daemon

state = Path(sys.argv[1])
over = {k: json.loads(v) for k, v in (a.split("=", 1) for a in sys.argv[2:])}
d = start_daemon(state, **over)
(state / "coords.json").write_text(json.dumps({"url": d.url, "token": d.token, "other": d.other_token,
                                                "cacert": d.cacert, "pid": d.pid}))
signal.signal(signal.SIGTERM, lambda *a: (stop_daemon(d), sys.exit(0)))
try:
    while d.proc.poll() is None:
        time.sleep(0.5)
finally:
    stop_daemon(d)
