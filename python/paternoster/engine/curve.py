"""CURVE security of a ``tcp://`` engine link: encrypted, and only the one
engine that was given its key may connect.

ZeroMQ's CurveZMQ (Curve25519 key exchange, every frame encrypted and
authenticated) with a ZAP handler on the frontend's side:

- the frontend binds both link sockets as the CURVE **server** with a keypair
  made when the link binds (:class:`LinkKeys`), and admits only one client
  key, the engine's, through a ZAP authenticator on the link's own context;
- the engine connects as a CURVE **client** (:class:`EngineKeys`): it knows the
  server's public key, so it talks only to that frontend, and holds a keypair
  the frontend made for it at the same time, handed over the channel that
  starts it (a Ray actor: an argument of its ``run`` call, Ray's own channel;
  a local child: ``PATERNOSTER_ENGINE_CURVE_KEYS`` in its environment).

A peer without the keys gets nothing through: a plain ZeroMQ socket fails the
CURVE handshake, and a CURVE client with another keypair is refused by ZAP.
``ipc://`` links have none of this (their socket files live in a private
0700 directory). Without CURVE in this libzmq, a tcp link refuses to start
(:func:`require_curve`): it never falls back to plain text.
"""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass, field

import zmq

logger = logging.getLogger("paternoster.engine")

#: The environment variable a local engine child reads its keys from
#: (``SERVER_PUBLIC PUBLIC SECRET``, Z85, space-separated).
CURVE_KEYS_ENV = "PATERNOSTER_ENGINE_CURVE_KEYS"
#: The ZAP domain of the link's server sockets (the one the authenticator serves).
ZAP_DOMAIN = "paternoster-engine-link"
_Z85_KEY_CHARS = 40


def require_curve() -> None:
    """Refuse a tcp engine link when this libzmq has no CURVE.

    Raises:
        ValueError: ``zmq.has("curve")`` is false, saying what to install.
    """
    if not zmq.has("curve"):
        raise ValueError(
            "the engine link over tcp (--distributed-executor-backend ray) is encrypted with "
            f"ZeroMQ CURVE, and this libzmq ({zmq.zmq_version()}, pyzmq {zmq.__version__}) "
            "was built without it (no libsodium): on every node, install pyzmq's own wheel, "
            "whose libzmq has it (pip install --force-reinstall --only-binary pyzmq pyzmq)"
        )


def is_tcp(address: str) -> bool:
    """Whether ``address`` is a ``tcp://`` endpoint (the links that get CURVE)."""
    return address.startswith("tcp://")


@dataclass(frozen=True)
class EngineKeys:
    """The engine's half of a tcp link's keys (Z85 text, 40 characters each).

    Attributes:
        server_public: the frontend's public key (the engine checks it is
            talking to that frontend).
        public: the engine's public key (the one the frontend admits).
        secret: the engine's secret key (left out of ``repr``).
    """

    server_public: str
    public: str
    secret: str = field(repr=False)

    def __post_init__(self) -> None:
        for name in ("server_public", "public", "secret"):
            value = getattr(self, name)
            if not isinstance(value, str) or len(value) != _Z85_KEY_CHARS:
                raise ValueError(f"CURVE key {name} must be {_Z85_KEY_CHARS} Z85 characters")

    def apply(self, sock: zmq.Socket) -> None:
        """Make ``sock`` a CURVE client of the frontend (before it connects)."""
        sock.setsockopt(zmq.CURVE_SERVERKEY, self.server_public.encode())
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public.encode())
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.secret.encode())

    def to_env(self) -> str:
        """The keys as one :data:`CURVE_KEYS_ENV` value."""
        return f"{self.server_public} {self.public} {self.secret}"

    @classmethod
    def from_env(cls, value: str) -> EngineKeys:
        """Read :meth:`to_env`'s value.

        Raises:
            ValueError: not three 40-character keys.
        """
        parts = value.split()
        if len(parts) != 3:
            raise ValueError(f"{CURVE_KEYS_ENV} must hold 3 space-separated Z85 keys")
        return cls(*parts)


class _OneKey:
    """The ZAP credentials provider admitting one client public key."""

    def __init__(self, public: str):
        self.public = public.encode()

    def callback(self, domain: str, key: bytes) -> bool:
        if hmac.compare_digest(key, self.public):
            return True
        logger.warning("refused a CURVE client on the engine link: not the engine's key")
        return False


class LinkKeys:
    """The frontend's side of a tcp link: a server keypair and the engine's
    keypair, both made here, and the ZAP authenticator admitting only the
    engine's public key.

    Raises:
        ValueError: no CURVE in this libzmq (:func:`require_curve`).
    """

    def __init__(self) -> None:
        require_curve()
        server_public, self._server_secret = zmq.curve_keypair()
        public, secret = zmq.curve_keypair()
        self.server_public = server_public.decode()
        self.engine = EngineKeys(self.server_public, public.decode(), secret.decode())
        self._auth = None

    def start(self, ctx: zmq.Context) -> None:
        """Start the ZAP authenticator on ``ctx`` (before any server socket
        binds: without a ZAP handler a CURVE server admits any client key)."""
        from zmq.auth.thread import ThreadAuthenticator

        self._auth = ThreadAuthenticator(ctx, log=logging.getLogger("paternoster.engine.zap"))
        self._auth.start()
        self._auth.configure_curve_callback(ZAP_DOMAIN, _OneKey(self.engine.public))

    def apply(self, sock: zmq.Socket) -> None:
        """Make ``sock`` the CURVE server (before it binds)."""
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self._server_secret)
        sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN.encode())

    def stop(self) -> None:
        """Stop the authenticator (after the server sockets are closed). Idempotent."""
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
