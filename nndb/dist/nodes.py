"""A job of several nodes: every rank reports to node 0's front.

On one node the front listens on a Unix socket in a directory only its
user can enter.  When the job spans nodes, node 0's front (the ``nndb run``
given ``--node-rank 0``) also listens on TCP, and its local rank 0 puts the
front's address and the job's secret into torchrun's own rendezvous store
(the agent store every worker reaches at MASTER_ADDR:MASTER_PORT); the
workers of the other nodes read them there and connect.  Whoever cannot
read that store cannot attach to a rank: the front and a worker each prove
that they know the secret (an HMAC of the other side's fresh nonce), so the
secret itself never crosses the connection, a worker never takes commands
from a process that is not its front, and the front never takes a process
that is not a rank of its job.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import socket

from ..errors import UsageError
from .job import agent_store

PUBLISH_ENV = "NNDB_FRONT_PUBLISH"        # node 0's workers: the front's TCP port (local rank 0 publishes it)
FROM_STORE_ENV = "NNDB_FRONT_FROM_STORE"  # the other nodes' workers: find the front through the store
_KEY = "nndb/front"
_CONNECT_S = 5.0
HELLO_LIMIT = 1 << 16                      # (bytes: a message before the proof is checked)


def nonce() -> str:
    return secrets.token_hex(16)


def proof(secret: str, role: str, their_nonce: str) -> str:
    """What ``role`` ("front" or "rank") answers to the other side's nonce."""
    return hmac.new(secret.encode(), f"nndb|{role}|{their_nonce}".encode(), hashlib.sha256).hexdigest()


def proven(secret: str, role: str, my_nonce: str, answer) -> bool:
    return isinstance(answer, str) and hmac.compare_digest(answer, proof(secret, role, my_nonce))


def _key(env) -> str:
    return f"{_KEY}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def _hosts(env) -> list:
    """Where the other nodes may reach this one: the address this node
    reaches the store from (the route the job already uses), then its names."""
    out = []
    try:
        with socket.create_connection((env["MASTER_ADDR"], int(env["MASTER_PORT"])), timeout=_CONNECT_S) as s:
            out.append(s.getsockname()[0])
    except (OSError, KeyError, ValueError):
        pass
    for name in (socket.getfqdn(), socket.gethostname()):
        if name and name not in out:
            out.append(name)
    return out


def publish(env, port: int, secret: str) -> None:
    """Node 0's local rank 0: the front's address and the secret into the store."""
    store = agent_store(env)
    if store is None:
        raise UsageError("the job spans nodes but torchrun gave its workers no store to find node 0's nndb "
                         "front through")
    store.set(_key(env), json.dumps({"hosts": _hosts(env), "port": int(port), "secret": secret}))


def lookup(env) -> dict:
    """The other nodes' workers: node 0's front as published ({hosts, port, secret})."""
    try:
        store = agent_store(env)
        if store is None:
            raise RuntimeError("torchrun gave the workers no store")
        return json.loads(store.get(_key(env)).decode("utf-8"))
    except Exception as e:          # (the store's own errors: one line)
        raise UsageError(f"cannot find node 0's nndb front through torchrun's store (is node 0 started with "
                         f"nndb run?): {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None


def connect(record: dict) -> socket.socket:
    """A TCP connection to node 0's front, trying each published host."""
    errors = []
    for host in record.get("hosts") or ():
        try:
            sock = socket.create_connection((host, int(record["port"])), timeout=_CONNECT_S)
            sock.settimeout(None)
            return sock
        except OSError as e:
            errors.append(f"{host}: {e.strerror or e}")
    raise UsageError(f"cannot reach node 0's nndb front at port {record.get('port')}: " + "; ".join(errors))


def tcp_listener() -> socket.socket:
    """Node 0's front on every interface (other nodes connect), a free port."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("", 0))
    s.listen(64)
    return s


def _is_local(host: str) -> bool:
    if host in ("localhost", "0.0.0.0", "::", "::1") or host.startswith("127."):
        return True
    try:
        mine = {socket.gethostname(), socket.getfqdn()}
        return host in mine or socket.gethostbyname(host) in {socket.gethostbyname(h) for h in mine}
    except OSError:
        return False


def check_endpoint(endpoint: str, timeout: float = 5.0) -> None:
    """A rendezvous endpoint on another machine must be reachable now (else
    torch waits for many minutes); one on this machine may not be up yet
    (this node may be the one to start it)."""
    host, sep, port = endpoint.rpartition(":")
    if not sep:
        host, port = endpoint, ""
    host = host.strip("[]")
    if port and not port.isdigit():
        raise UsageError(f"--rdzv-endpoint must be HOST[:PORT], not {endpoint!r}")
    try:
        socket.getaddrinfo(host, None)
    except OSError:
        raise UsageError(f"cannot reach the rendezvous endpoint {endpoint}: unknown host {host!r}") from None
    if _is_local(host) or not port:
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as e:
        raise UsageError(f"cannot reach the rendezvous endpoint {endpoint}: "
                         f"{e.strerror or type(e).__name__ or e}") from None
