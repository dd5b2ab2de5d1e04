"""Who may talk to the remediator: the credentials Alertmanager sends, read from files.

Alertmanager's webhook `http_config` sends either `authorization` (Bearer, from
`credentials_file`) or `basic_auth` (from `password_file`); we read the same
files. Secrets are compared in constant time, and a service without credentials
refuses to start unless the operator says, in so many words, that it is insecure.

Every path except `/healthz` needs the credentials, the on-call page included: it
shows label values, commands and escalation details, read-only but not public. A
browser sends basic auth, so give on-call `basic_username` + `basic_password_file`
(Alertmanager may keep using the bearer token; both are accepted at once).
"""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Middleware

from mlx_medic.remediator.config import AuthConfig

REALM = "mlx-medic"
# Paths anyone may read: a load balancer's liveness probe carries no credentials.
PUBLIC_PATHS = frozenset({"/healthz"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# What was decided about a request, for its single log line (see webapp.decision_log).
DECISION_KEY = web.RequestKey("decision", dict)


class AuthError(ValueError):
    """Credentials cannot be loaded, or none are configured without the insecure flag."""


def _read_secret(path: Path, what: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise AuthError(f"cannot read the {what} file {path}: {exc.strerror or exc}") from exc
    # Like Alertmanager/Prometheus, surrounding whitespace (the trailing newline) is not secret.
    secret = data.strip()
    if not secret:
        raise AuthError(f"the {what} file {path} is empty")
    return secret


@dataclass(frozen=True)
class Credentials:
    """Loaded secrets; None means that scheme is not accepted."""

    bearer_token: bytes | None = None
    basic_username: bytes | None = None
    basic_password: bytes | None = None

    @classmethod
    def load(cls, config: AuthConfig) -> Credentials:
        token = (
            _read_secret(config.bearer_token_file, "bearer token")
            if config.bearer_token_file is not None
            else None
        )
        password = (
            _read_secret(config.basic_password_file, "basic auth password")
            if config.basic_password_file is not None
            else None
        )
        username = config.basic_username.encode() if config.basic_username is not None else None
        return cls(bearer_token=token, basic_username=username, basic_password=password)

    @property
    def configured(self) -> bool:
        return self.bearer_token is not None or self.basic_password is not None

    def challenge(self) -> list[str]:
        """WWW-Authenticate values for the schemes we accept."""
        values = []
        if self.bearer_token is not None:
            values.append(f'Bearer realm="{REALM}"')
        if self.basic_password is not None:
            values.append(f'Basic realm="{REALM}", charset="UTF-8"')
        return values

    def check(self, authorization: str | None) -> str | None:
        """None when the header proves who is calling, else the reason it does not."""
        if not authorization:
            return "no credentials"
        scheme, _, value = authorization.strip().partition(" ")
        scheme = scheme.lower()
        value = value.strip()
        if scheme == "bearer" and self.bearer_token is not None:
            if hmac.compare_digest(value.encode("utf-8", "surrogateescape"), self.bearer_token):
                return None
            return "wrong bearer token"
        if scheme == "basic" and self.basic_password is not None:
            assert self.basic_username is not None
            try:
                decoded = base64.b64decode(value.encode("ascii"), validate=True)
            except (binascii.Error, UnicodeEncodeError):
                return "malformed basic credentials"
            user, sep, password = decoded.partition(b":")
            if not sep:
                return "malformed basic credentials"
            # Both comparisons always run, so timing does not tell which half was wrong.
            user_ok = hmac.compare_digest(user, self.basic_username)
            password_ok = hmac.compare_digest(password, self.basic_password)
            return None if user_ok & password_ok else "wrong basic credentials"
        return f"unsupported authorization scheme {scheme[:20]!r}"


def load_credentials(config: AuthConfig, insecure_no_auth: bool) -> Credentials | None:
    """The credentials to demand, or None when the operator explicitly chose no auth."""
    if config.configured:
        return Credentials.load(config)
    if insecure_no_auth:
        return None
    raise AuthError(
        "no credentials configured: set auth.bearer_token_file (Alertmanager's"
        " authorization.credentials_file) or auth.basic_username + auth.basic_password_file"
        " (basic_auth.password_file) in the config file; to run without authentication"
        " anyway, set insecure_no_auth: true or pass --insecure-no-auth"
    )


def auth_middleware(credentials: Credentials | None) -> Middleware:
    """401 with a challenge for every protected path unless the request proves itself."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if credentials is None or request.path in PUBLIC_PATHS:
            return await handler(request)
        problem = credentials.check(request.headers.get("Authorization"))
        if problem is None:
            return await handler(request)
        request[DECISION_KEY] = {"reason": problem}
        response = web.json_response({"status": "unauthorized", "reason": problem}, status=401)
        for value in credentials.challenge():
            response.headers.add("WWW-Authenticate", value)
        return response

    return middleware
