"""A job of several nodes: every rank reports to node 0's front.

On one node the front listens on a Unix socket in a directory only its
user can enter, and the job's secret is a fresh random one, handed to the
workers in their environment.  When the job spans nodes, node 0's front (the
``nndb run`` given ``--node-rank 0``) also listens on TCP, bound to the
address the nodes reach the rendezvous at (``bind_host``: loopback for a
rendezvous on localhost), and its local rank 0 puts the front's address (not
the secret) into torchrun's rendezvous store; the workers of the other nodes
read it there and connect.

That store has no authentication: anyone who reaches its port reads and
writes it.  So the job's secret never goes there: it is given to every node
out of band, as ``NNDB_JOB_SECRET`` in the environment of each node's
``nndb run`` (the same value on every node, at least 16 characters; the
launch refuses a job of several nodes without it).  The front and a worker
each prove that they know it (an HMAC of the other side's fresh nonce), so
the secret never crosses the connection; a stranger's hello is refused and
the job goes on.  After the handshake every message carries an HMAC under a
key drawn from the secret and both nonces, with its sequence number
(``SealedChannel``), so a process that relays a handshake (having put its own
address into the store) can neither inject nor alter a message.  What this
does not give: secrecy of the messages (statistics, the ranks' output, the
commands cross in clear; use a private network or a tunnel for that), nor
protection from anyone who can write the store (they can stop the job, as
they can stop torchrun's own rendezvous).  docs/distributed.md has the
threat model.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import socket
from typing import Optional

from ..errors import UsageError
from ..timetravel.channel import Channel
from ..run.rank import agent_store

PUBLISH_ENV = "NNDB_FRONT_PUBLISH"        # node 0's workers: the front's HOST:PORT (local rank 0 publishes it)
JOB_SECRET_ENV = "NNDB_JOB_SECRET"        # the user's: the same secret on every node of a job of several
MIN_SECRET = 16
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


def job_secret(env) -> str:
    """A job of several nodes: the secret the user gave every node, out of band."""
    secret = env.get(JOB_SECRET_ENV, "")
    if len(secret) < MIN_SECRET:
        why = "is not set" if not secret else f"is shorter than {MIN_SECRET} characters"
        raise UsageError(f"a job of several nodes needs a secret that only its nodes know, and {JOB_SECRET_ENV} "
                         f"{why}: set it to the same random value on every node (for instance "
                         f"export {JOB_SECRET_ENV}=$(python -c 'import secrets; print(secrets.token_hex(16))'))")
    return secret


def session_key(secret: str, front_nonce: str, rank_nonce: str) -> bytes:
    return hmac.new(secret.encode(), f"nndb|session|{front_nonce}|{rank_nonce}".encode(), hashlib.sha256).digest()


class SealedChannel(Channel):
    """A channel after the handshake: each message goes as {"m": its JSON,
    "mac": HMAC(key, direction|sequence|JSON)}; one that fails the check, or
    comes out of order, ends the channel (recv gives None)."""

    def __init__(self, chan: Channel, key: bytes, me: str, them: str):
        super().__init__(chan.sock)
        self._key, self._me, self._them = key, me, them
        self._sent = self._got = 0

    def _mac(self, who: str, n: int, text: str) -> str:
        return hmac.new(self._key, f"{who}|{n}|{text}".encode(), hashlib.sha256).hexdigest()

    def send(self, obj: dict) -> bool:
        text = json.dumps(obj)
        mac = self._mac(self._me, self._sent, text)
        self._sent += 1
        return super().send({"m": text, "mac": mac})

    def recv(self, limit=None):
        frame = super().recv(limit)
        if frame is None:
            return None
        text, mac = frame.get("m"), frame.get("mac")
        if not (isinstance(text, str) and isinstance(mac, str)
                and hmac.compare_digest(mac, self._mac(self._them, self._got, text))):
            self.close()
            return None
        self._got += 1
        msg = json.loads(text)
        return msg if isinstance(msg, dict) else None


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


def publish(env, address: str) -> None:
    """Node 0's local rank 0: the front's address (HOST:PORT; a wildcard
    HOST: this node's addresses) into the store.  Never the secret."""
    store = agent_store(env)
    if store is None:
        raise UsageError("the job spans nodes but torchrun gave its workers no store to find node 0's nndb "
                         "front through")
    host, _, port = address.rpartition(":")
    hosts = _hosts(env) if host in ("", "0.0.0.0", "::") else [host]
    store.set(_key(env), json.dumps({"hosts": hosts, "port": int(port)}))


def lookup(env) -> dict:
    """The other nodes' workers: node 0's front as published ({hosts, port})."""
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


def bind_host(endpoint: Optional[str]) -> str:
    """The address node 0's front listens on: the one the nodes use, that of
    the rendezvous endpoint (HOST[:PORT], torchrun's --rdzv-endpoint or
    --master-addr): its own address when it is this machine (127.0.0.1 for
    localhost), else the address of this machine's interface towards it.
    Every interface ('') only when there is no endpoint to go by."""
    if not endpoint:
        return ""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not port.isdigit():
        host, port = endpoint, ""
    host = host.strip("[]")
    try:
        if _is_local(host):
            ip = socket.gethostbyname(host)
            return "" if ip == "0.0.0.0" else ip
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:     # (no packet sent: the route)
            probe.connect((socket.gethostbyname(host), int(port or 9)))
            return probe.getsockname()[0]
    except (OSError, ValueError):
        return ""


def tcp_listener(host: str = "") -> socket.socket:
    """Node 0's front on ``host`` (bind_host; other nodes connect), a free port."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((host, 0))
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
