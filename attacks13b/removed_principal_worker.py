"""A compromised front keeps reading with a removed principal's OS account through a worker it
holds (SPEC §5.3: removing a principal ends its workers within seconds; docs/PRIVSEP.md §7).

The front spawns a worker with carol's token and keeps its socket; the administrator removes
carol from users.yaml; 5 s later the front reads /etc/passwd through the same worker, as carol's
account. Nothing on the root side ended the worker (the honest front's pool does it; a
compromised one does not). Fixed: the policy process checks every worker's token about once a
second and has root kill those whose principal or token is gone (``server.end_revoked``).
Exits 0 when the read after the removal still works.
"""
import json
import subprocess
import sys

from _lib import daemon, stop
from mcpd.common import identity
from tests.integration.test_attack13b import HELD_WORKER, PRELUDE, add_principal

if __name__ == "__main__":
    d, factory = daemon()
    try:
        token, path, users = add_principal(d, factory, "carol")
        with subprocess.Popen(["setpriv", f"--reuid={d.service.pw_uid}", f"--regid={d.service.pw_gid}",
                               "--clear-groups", sys.executable, "-I", "-c", PRELUDE + HELD_WORKER,
                               str(d.socket_path), token, "5"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as proc:
            assert proc.stdout is not None and proc.stdin is not None
            before = json.loads(proc.stdout.readline())
            del users["carol"]
            identity.save_users(path, users)
            proc.stdin.write("go\n")
            proc.stdin.flush()
            after = json.loads(proc.stdout.readline())
        print("read through carol's worker before the removal:", before, "; 5 s after it:", after)
        print("records:", [(r["event"], r.get("reason")) for r in d.audit() if r.get("user") == "carol"])
        sys.exit(0 if after else 1)
    finally:
        stop(d, factory)
