"""``mcpd status``: what an operator checks on one host, gathered without any privileged channel.

Where each fact comes from:

- the configuration file: version, listening addresses, the files' paths;
- the listener itself: one TLS handshake (no request, no token) gives the certificate served now;
- the certificate and key files, checked as the front checks them (:func:`mcpd.front.tls.read_pair`);
- ``tls-state.json`` in the front's ``state_dir`` (written by the front at start and at every
  reload): the pair in use, when it was loaded, the last check and why it was refused;
- the metrics endpoint (``metrics_listen``, loopback, when on): sessions, workers, whether the
  helper's policy process answers;
- the helper socket: present, and whether a connection to it is accepted now (as the service user
  when run as root, so the policy process takes it as the front's and records no alert); the
  grants and users files, validated as their ``check`` commands do; the audit log's last
  ``reload``/``reload_failed`` records;
- the chains' heads: the audit log's head file (``audit.head`` in ``helper_state_dir``) and the
  access log's last record.

A fact the caller may not read (not root) is reported with the reason, never guessed.
"""

from __future__ import annotations

import datetime
import errno
import ipaddress
import json
import math
import os
import pwd
import select
import signal
import socket
import ssl
import time
import urllib.error
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from mcpd.admin.audit.filters import Filter, last_records
from mcpd.admin.audit.logfiles import rotated_set, tail_lines
from mcpd.admin.certs import describe
from mcpd.common.audit.chain import chain_after
from mcpd.common.audit.head import read_head_at
from mcpd.common.config import Config, load
from mcpd.common.identity import MISSING_USERS_FILE, load_users
from mcpd.common.printable import printable
from mcpd.common.version import version
from mcpd.front import tls
from mcpd.front.metrics import parse_listen
from mcpd.policy.grants import load_policy, secret_paths

#: how long the handshake with the listener and the metrics request may take, in seconds
TIMEOUT_SECONDS = 5.0
#: how long the child that connects as ``service_user`` may take, beyond its own connect
#: timeout, before it is killed and the answer is "unknown" (that account can stop it)
CHILD_GRACE_SECONDS = 2.0


def _problem(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def _connect_host(host: str) -> str:
    """The address to reach a listener bound to ``host`` from this host (the wildcard: loopback)."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host
    if ip.is_unspecified:
        return "::1" if ip.version == 6 else "127.0.0.1"
    return host


def served_certificate(host: str, port: int) -> dict[str, Any]:
    """The certificate a new handshake with ``host``:``port`` gets (not verified: only looked at)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    try:
        with socket.create_connection((_connect_host(host), port), timeout=TIMEOUT_SECONDS) as raw:
            with ctx.wrap_socket(raw, server_hostname=host) as conn:
                der = conn.getpeercert(binary_form=True)
                proto = conn.version()
    except (OSError, ssl.SSLError) as exc:
        return {"answers": False, "problem": _problem(exc)}
    if der is None:
        return {"answers": True, "problem": "no certificate"}
    facts = describe(ssl.DER_cert_to_PEM_cert(der).encode())
    return {"answers": True, "protocol": proto, "fingerprint_sha256": facts.fingerprint,
            "subject": facts.subject, "not_after": facts.not_after.isoformat()}


def tls_files(cfg: Config) -> dict[str, Any]:
    """The configured pair checked now as a reload would check it, and the front's own record."""
    out: dict[str, Any] = {"cert": cfg.tls.cert, "key": cfg.tls.key}
    try:
        pair = tls.read_pair(cfg.tls.cert, cfg.tls.key, owners=_service_uid(cfg))
        out.update(valid=True, fingerprint_sha256=pair.fingerprint, subject=pair.subject,
                   not_after=pair.not_after.isoformat())
    except tls.PairError as exc:
        out.update(valid=False, problem=str(exc))
    path = os.path.join(cfg.state_dir, tls.STATE_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            state = json.loads(f.read(1 << 20))
        out["front"] = state if isinstance(state, dict) else None
        if out["front"] is None:
            out["front_problem"] = f"{path}: not a JSON object"
    except (OSError, ValueError) as exc:
        out["front"] = None
        out["front_problem"] = f"{path}: {_problem(exc)}"
    except RecursionError:
        out["front"] = None
        out["front_problem"] = f"{path}: JSON nested too deeply"
    return out


def _service_uid(cfg: Config) -> tuple[int, ...]:
    """The uid of ``service_user`` (the front's, which may own the key), none when unknown."""
    try:
        return (pwd.getpwnam(cfg.service_user).pw_uid,)
    except KeyError:
        return ()


def metrics(cfg: Config) -> dict[str, Any] | None:
    """Sessions, workers and the helper's state from the metrics endpoint; ``None`` when it is off."""
    if not cfg.metrics_listen:
        return None
    host, port = parse_listen(cfg.metrics_listen)
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as r:  # noqa: S310 - loopback, from the config
            text = r.read(1 << 22).decode("utf-8", "replace")
    except (OSError, urllib.error.URLError) as exc:
        return {"listen": cfg.metrics_listen, "answers": False, "problem": _problem(exc)}
    out: dict[str, Any] = {"listen": cfg.metrics_listen, "answers": True, "sessions": {}}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "mcpd_sessions":
                    out["sessions"][str(sample.labels.get("transport", ""))] = _count(sample.value)
                elif sample.name in ("mcpd_workers", "mcpd_workers_busy", "mcpd_pool_queued"):
                    out[sample.name.removeprefix("mcpd_")] = _count(sample.value)
                elif sample.name == "mcpd_helper_up":
                    out["helper_up"] = None if _count(sample.value) is None else bool(sample.value)
    except (ValueError, TypeError, IndexError, RecursionError) as exc:  # not the exposition format
        return {"listen": cfg.metrics_listen, "answers": False,
                "problem": f"its answer is not Prometheus metrics ({type(exc).__name__})"}
    return out


def _count(value: Any) -> int | None:
    """A metric's value as a count, or ``None`` (unknown) when it is none: NaN, infinite,
    negative or not a whole number."""
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 or value != int(value):
        return None
    return int(value)


def _connect(path: str) -> int:
    """0 when a stream connection to the Unix socket ``path`` is accepted within
    :data:`TIMEOUT_SECONDS`, else the errno why not."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(TIMEOUT_SECONDS)
            s.connect(path)
        return 0
    except TimeoutError:
        return errno.ETIMEDOUT
    except OSError as exc:
        return exc.errno or errno.EIO


def helper_socket(cfg: Config) -> dict[str, Any]:
    """The helper socket: whether it is there and whether a connection to it is accepted now
    (``accepts``; refused or timed out: the helper and its policy process are not answering).

    Run as root, the connection is made by a child process as ``service_user``, the only peer the
    policy process serves, so it is taken and closed like one of the front's (an ``alert`` in the
    audit log otherwise); run as another account, as that account."""
    out: dict[str, Any] = {"socket": cfg.helper_socket or None,
                           "socket_present": bool(cfg.helper_socket) and os.path.exists(cfg.helper_socket)}
    if not out["socket_present"]:
        return out
    code = None
    if os.geteuid() == 0:
        try:
            svc = pwd.getpwnam(cfg.service_user)
        except KeyError:
            svc = None
        if svc is not None:
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child
                try:
                    os.setgroups([])
                    os.setgid(svc.pw_gid)
                    os.setuid(svc.pw_uid)
                    os._exit(_connect(cfg.helper_socket) & 0xFF)
                except BaseException:
                    os._exit(errno.EPERM)
            code = _reap(pid, TIMEOUT_SECONDS + CHILD_GRACE_SECONDS)
            if code is None:
                out["accepts"] = None
                out["problem"] = (f"unknown: the check as {cfg.service_user} did not end within "
                                  f"{TIMEOUT_SECONDS + CHILD_GRACE_SECONDS:g} s (stopped or stuck; killed)")
                return out
    if code is None:
        code = _connect(cfg.helper_socket)
    out["accepts"] = code == 0
    if code:
        out["problem"] = os.strerror(code) if code > 0 else f"killed by signal {-code}"
    return out


def _reap(pid: int, deadline: float) -> int | None:
    """The exit code of our child ``pid`` (negative: the signal that ended it), waited for at most
    ``deadline`` seconds; ``None`` when it had not ended by then: it is killed (``SIGKILL`` ends a
    stopped process too) and reaped. The child runs as another account, which may stop it
    (``SIGSTOP``), so a plain ``waitpid`` could wait forever."""
    pidfd = os.pidfd_open(pid)
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        end = time.monotonic() + deadline
        while (left := end - time.monotonic()) > 0 and not poller.poll(max(1, int(left * 1000))):
            pass
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    finally:
        os.close(pidfd)
    os.waitpid(pid, 0)  # (killed: ends now, stopped or not)
    return None


def policy_files(cfg: Config, config_path: str) -> dict[str, Any]:
    """Whether the grants and users files are valid now, and the grants' last (re)load recorded."""
    out: dict[str, Any] = {"grants_file": cfg.grants_file, "users_file": cfg.users_file}
    try:
        load_policy(cfg.grants_file, 0, secret_paths(cfg, config_path))
        out["grants_valid"] = True
    except Exception as exc:  # noqa: BLE001 - PolicyError or OSError: reported, not raised
        out["grants_valid"] = False
        errors = getattr(exc, "errors", None)
        out["grants_problem"] = "; ".join(errors) if isinstance(errors, list) else _problem(exc)
    try:
        os.lstat(cfg.users_file)
        out["users_present"] = True
    except FileNotFoundError:  # the daemon reads it as no principals (mcpd users check: missing)
        out["users_present"] = False
    except OSError:  # (not root: /etc/mcpd is closed) judged by the load below
        out["users_present"] = None
    try:
        load_users(cfg.users_file, owner_uid=0)
        out["users_valid"] = True
    except Exception as exc:  # noqa: BLE001 - UsersFileError or OSError
        out["users_valid"] = False
        out["users_problem"] = _problem(exc)
    out["last_reload"] = None
    try:
        found: list[tuple[bytes, dict[str, Any]]] = []
        for event in ("reload", "reload_failed"):
            found += last_records(rotated_set(cfg.audit_log), Filter(event=event), 1)
        if found:
            rec = max((r for _, r in found), key=lambda r: r.get("seq", 0) if isinstance(r.get("seq"), int) else 0)
            out["last_reload"] = {"time": rec.get("time"), "ok": rec.get("event") == "reload",
                                  "load": rec.get("load"), "seq": rec.get("seq")}
    except OSError as exc:
        out["last_reload_problem"] = f"{cfg.audit_log}: {_problem(exc)}"
    return out


def chains(cfg: Config) -> dict[str, Any]:
    """The heads of the two hash chains: the audit log's (its writer's head file) and the access
    log's (its last record)."""
    out: dict[str, Any] = {}
    try:
        head = read_head_at(cfg.helper_state_dir)
        out["audit"] = {"log": cfg.audit_log, "seq": head.seq, "hash": head.hash} if head else \
            {"log": cfg.audit_log, "seq": 0, "hash": None}
    except (OSError, ValueError) as exc:
        out["audit"] = {"log": cfg.audit_log, "problem": f"{cfg.helper_state_dir}: {_problem(exc)}"}
    if cfg.access_log:
        try:
            last = tail_lines(cfg.access_log, 1)
            seq, digest = chain_after(last[0] if last else b"")
            out["access"] = {"log": cfg.access_log, "seq": seq, "hash": digest if last else None}
        except OSError as exc:
            out["access"] = {"log": cfg.access_log, "problem": _problem(exc)}
    return out


def gather(config_path: str) -> dict[str, Any]:
    """Every fact :mod:`mcpd.admin.status` names, as JSON types, and ``problems``: what an
    operator must look at (empty when all is well).

    Raises:
        mcpd.common.config.ConfigError: the configuration cannot be loaded.
    """
    cfg = load(config_path)
    served = served_certificate(cfg.listen.host, cfg.listen.port)
    files = tls_files(cfg)
    status: dict[str, Any] = {
        "version": version(), "config": config_path,
        "listen": {"address": f"{cfg.listen.host}:{cfg.listen.port}", **served},
        "tls": files,
        "metrics": metrics(cfg),
        "helper": helper_socket(cfg),
        "policy": policy_files(cfg, config_path),
        "chains": chains(cfg),
        "checked_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    problems = []
    if not served.get("answers"):
        problems.append(f"the listener {status['listen']['address']} does not answer: {served.get('problem')}")
    if not files.get("valid"):
        problems.append(f"the TLS files would be refused: {files.get('problem')}")
    elif served.get("fingerprint_sha256") and served["fingerprint_sha256"] != files.get("fingerprint_sha256"):
        problems.append("the certificate served is not the one in the files (reload refused, or not reloaded yet)")
    front = files.get("front")
    if isinstance(front, dict) and front.get("refused"):
        problems.append(f"the last TLS reload was refused: {front['refused']}")
    m = status["metrics"]
    if m is not None and not m.get("answers"):
        problems.append(f"the metrics endpoint does not answer: {m.get('problem')}")
    elif m is not None and m.get("helper_up") is False:
        problems.append("the root helper's policy process does not answer")
    if cfg.helper_socket and not status["helper"]["socket_present"]:
        problems.append(f"no helper socket at {cfg.helper_socket}")
    elif cfg.helper_socket and status["helper"]["accepts"] is None:
        problems.append(f"whether the helper socket {cfg.helper_socket} accepts a connection is "
                        f"{status['helper'].get('problem')}")
    elif cfg.helper_socket and not status["helper"]["accepts"]:
        problems.append(f"the helper socket {cfg.helper_socket} accepts no connection "
                        f"({status['helper'].get('problem')}): the root helper and its policy process are not "
                        "answering (systemctl status mcpd-helper; journalctl -u mcpd-helper)")
    pol = status["policy"]
    for what in ("grants", "users"):
        if not pol[f"{what}_valid"]:
            problems.append(f"the {what} file {pol[f'{what}_file']} is not valid: {pol.get(f'{what}_problem')}")
    if pol.get("last_reload") and not pol["last_reload"]["ok"]:
        problems.append("the last grants reload failed (the last good grants stay in force)")
    status["problems"] = problems
    return status


def _line(label: str, value: Any) -> str:
    return f"{label}: {printable(str(value))}"


def _known(value: Any) -> str:
    return "unknown" if value is None else str(value)


def render(s: dict[str, Any]) -> list[str]:
    """``s`` (:func:`gather`) as lines for a terminal: every value through the one escape rule
    (:func:`mcpd.common.printable.printable`)."""
    out = [_line("mcpd", s["version"]), _line("config", s["config"])]
    li = s["listen"]
    out.append(_line("listening", f"{li['address']} ({'answers, ' + li['protocol'] if li.get('answers') and 'protocol' in li else 'does not answer: ' + str(li.get('problem'))})"))
    if li.get("fingerprint_sha256"):
        out += [_line("  served certificate", li["subject"]), _line("  expires", li["not_after"]),
                _line("  fingerprint", li["fingerprint_sha256"])]
    t = s["tls"]
    out.append(_line("tls files", f"{t['cert']}, {t['key']}: " + ("valid" if t.get("valid") else f"refused: {t.get('problem')}")))
    if t.get("valid"):
        out += [_line("  subject", t["subject"]), _line("  expires", t["not_after"]),
                _line("  fingerprint", t["fingerprint_sha256"])]
    front = t.get("front")
    if isinstance(front, dict):
        out.append(_line("  last reload", f"loaded {front.get('loaded_at')}, checked {front.get('checked_at')}: "
                                          + ("ok" if front.get("last_check_ok") else f"refused: {front.get('refused')}")))
    else:
        out.append(_line("  last reload", f"unknown ({t.get('front_problem')})"))
    m = s["metrics"]
    if m is None:
        out.append(_line("sessions, workers", "unknown (metrics_listen is off)"))
    elif not m.get("answers"):
        out.append(_line("sessions, workers", f"unknown (metrics {m['listen']}: {m.get('problem')})"))
    else:
        sess = ", ".join(f"{k} {_known(v)}" for k, v in sorted(m["sessions"].items())) or "none"
        out += [_line("sessions", sess),
                _line("workers", f"{_known(m.get('workers'))} live, {_known(m.get('workers_busy'))} busy, "
                                 f"{_known(m.get('pool_queued'))} calls waiting")]
    h = s["helper"]
    helper_up = None if m is None or not m.get("answers") else m.get("helper_up")
    accepts = "" if not h["socket_present"] else \
        ", accepts connections" if h.get("accepts") else \
        f", accepts connections: {h.get('problem')}" if h.get("accepts") is None else \
        f", accepts no connection ({h.get('problem')})"
    out.append(_line("helper", "none configured" if not h["socket"] else
                     f"socket {h['socket']} {'present' if h['socket_present'] else 'missing'}{accepts}"
                     + ("" if helper_up is None else f", policy process {'answers' if helper_up else 'does not answer'}")))
    p = s["policy"]
    for what in ("grants", "users"):
        valid = MISSING_USERS_FILE if what == "users" and p.get("users_present") is False else "valid"
        out.append(_line(f"{what} file", f"{p[f'{what}_file']}: " + (valid if p[f"{what}_valid"]
                                                                     else f"invalid: {p.get(f'{what}_problem')}")))
    lr = p.get("last_reload")
    out.append(_line("grants last load", "none recorded" if not lr and not p.get("last_reload_problem") else
                     f"unknown ({p['last_reload_problem']})" if not lr else
                     f"{lr['time']} ({lr['load']}, seq {lr['seq']}): {'ok' if lr['ok'] else 'failed, the last good stays'}"))
    for name, c in s["chains"].items():
        out.append(_line(f"{name} chain head", f"{c['log']}: " + (f"unknown ({c['problem']})" if "problem" in c else
                                                                  f"seq {c['seq']} hash {c['hash'] or '(empty log)'}")))
    out.append(_line("problems", len(s["problems"]) or "none"))
    out += [f"  - {printable(p)}" for p in s["problems"]]
    return out
