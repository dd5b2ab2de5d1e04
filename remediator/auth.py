"""Who may talk to the remediator: the credentials Alertmanager sends, read from files.

Alertmanager's webhook `http_config` sends either `authorization` (Bearer, from
`credentials_file`) or `basic_auth` (from `password_file`); we read the same
files. Secrets are compared in constant time, and a service without credentials
refuses to start unless the operator says, in so many words, that it is insecure.

Every path except `/healthz` needs credentials, the on-call page included: it shows
label values, commands and escalation details. The full credentials (`auth.*`) are
accepted everywhere; `auth.read_only`, a second set, only for reading (GET and HEAD:
the page, `/api/*`, `/metrics`), so the page can be shared without the power to post
alerts (a read-only credential on the webhook gets 403); `auth.read_only_open` serves
reading to anyone instead. A browser sends basic auth, so give on-call a basic pair.

Rotating a secret needs no restart: the files are reloaded on SIGHUP, and when one of
them changes (a stat, at most once a second, on request); the old secret is refused
from then on. A reload that fails keeps the credentials in force, logs the file and
why, and counts in `mlx_medic_credentials_reload_failures_total`.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client.core import CounterMetricFamily, Metric

from mlx_medic.remediator.config import AuthConfig, SecretFiles

log = logging.getLogger("mlx_medic.remediator.auth")

REALM = "mlx-medic"
# Paths anyone may read: a load balancer's liveness probe carries no credentials.
PUBLIC_PATHS = frozenset({"/healthz"})
# What a read-only credential may do: read. Every other method (the webhook's POST) writes.
READ_METHODS = frozenset({"GET", "HEAD"})
READ_ONLY_REFUSED = "read-only credentials may not post alerts"

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
    def load(cls, config: SecretFiles) -> Credentials:
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


@dataclass(frozen=True)
class Access:
    """Who may do what: `full` everywhere, `read_only` (or anyone, when `reads_open`)
    only for reading."""

    full: Credentials
    read_only: Credentials | None = None
    reads_open: bool = False

    @classmethod
    def load(cls, config: AuthConfig) -> Access:
        return cls(
            full=Credentials.load(config),
            read_only=None if config.read_only is None else Credentials.load(config.read_only),
            reads_open=config.read_only_open,
        )

    def refusal(self, authorization: str | None, writes: bool) -> tuple[int, str] | None:
        """None when the request may go on, else its status (401, 403) and why not."""
        if self.reads_open and not writes:
            return None
        problem = self.full.check(authorization)
        if problem is None:
            return None
        if self.read_only is not None:
            read_problem = self.read_only.check(authorization)
            if read_problem is None:
                return (403, READ_ONLY_REFUSED) if writes else None
            if problem.startswith("unsupported"):  # a scheme only the read-only set has
                problem = read_problem
        return 401, problem

    def challenge(self) -> list[str]:
        """WWW-Authenticate values for every scheme either set accepts."""
        read_only = [] if self.read_only is None else self.read_only.challenge()
        return list(dict.fromkeys(self.full.challenge() + read_only))

    def describe(self) -> dict[str, str]:
        """The schemes in force, for the start-up log line."""
        if self.reads_open:
            reads = "open"
        elif self.read_only is None:
            reads = "full credentials only"
        else:
            reads = schemes(self.read_only.challenge())
        return {"auth": schemes(self.full.challenge()), "read_only_auth": reads}


def schemes(challenge: list[str]) -> str:
    """`bearer, basic` from the WWW-Authenticate values."""
    return ", ".join(value.split()[0].lower() for value in challenge)


FileStamp = tuple[int, int, int] | None  # (inode, mtime ns, size); None: cannot stat


def _stamp(path: Path) -> FileStamp:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


class CredentialStore:
    """The Access in force, reloaded from its files on `reload()` (SIGHUP) and when a file
    changes: replaced (`mv`, a new inode), rewritten (mtime, size) or gone. Requests look
    at most once per `check_interval`, so a webhook storm pays a stat a second, not one
    per request. A failed reload keeps the old Access: a half-written file must not lock
    Alertmanager out."""

    def __init__(self, config: AuthConfig, check_interval: float = 1.0) -> None:
        self.config = config
        self.check_interval = check_interval
        self.files = [
            path
            for files in (config, config.read_only)
            if files is not None
            for path in (files.bearer_token_file, files.basic_password_file)
            if path is not None
        ]
        self.stamps = self._stamps()
        self.access = Access.load(config)  # AuthError: the service does not start
        self.checked = time.monotonic()
        self.reload_failures = 0

    def _stamps(self) -> list[FileStamp]:
        return [_stamp(path) for path in self.files]

    def current(self) -> Access:
        """The Access in force, reloaded first if a file changed since the last look."""
        now = time.monotonic()
        if now - self.checked >= self.check_interval:
            self.checked = now
            if self._stamps() != self.stamps:
                self.reload("a credentials file changed")
        return self.access

    def reload(self, why: str) -> bool:
        """Read every file again; on failure keep the old Access, log and count why."""
        self.stamps = self._stamps()  # before reading: a change meanwhile is seen next time
        try:
            self.access = Access.load(self.config)
        except AuthError as exc:
            self.reload_failures += 1
            log.error(f"credentials not reloaded ({why}); the old ones stay in force: {exc}")
            return False
        log.info(f"credentials reloaded ({why})")
        return True

    def collect(self) -> list[Metric]:
        return [
            CounterMetricFamily(
                "mlx_medic_credentials_reload_failures",
                "Reloads of the credentials files that failed (missing, unreadable, empty);"
                " the credentials in force before stayed.",
                value=self.reload_failures,
            )
        ]


def load_credentials(config: AuthConfig, insecure_no_auth: bool) -> CredentialStore | None:
    """The credentials to demand, or None when the operator explicitly chose no auth."""
    if config.configured:
        return CredentialStore(config)
    if insecure_no_auth and (config.read_only is not None or config.read_only_open):
        raise AuthError(
            "auth.read_only and auth.read_only_open narrow what the full credentials allow,"
            " and none are set: with insecure_no_auth every route is open to anyone; set"
            " auth.bearer_token_file or auth.basic_username + auth.basic_password_file, or"
            " remove the read-only settings"
        )
    if insecure_no_auth:
        return None
    raise AuthError(
        "no credentials configured: set auth.bearer_token_file (Alertmanager's"
        " authorization.credentials_file) or auth.basic_username + auth.basic_password_file"
        " (basic_auth.password_file) in the config file; to run without authentication"
        " anyway, set insecure_no_auth: true or pass --insecure-no-auth"
    )


def auth_middleware(store: CredentialStore | None) -> Middleware:
    """401 with a challenge for every protected path unless the request proves itself;
    403 for a read-only credential that would write."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if store is None or request.path in PUBLIC_PATHS:
            return await handler(request)
        access = store.current()
        refusal = access.refusal(
            request.headers.get("Authorization"), writes=request.method not in READ_METHODS
        )
        if refusal is None:
            return await handler(request)
        status, reason = refusal
        request[DECISION_KEY] = {"reason": reason}
        if status == 403:
            return web.json_response({"status": "forbidden", "reason": reason}, status=403)
        response = web.json_response({"status": "unauthorized", "reason": reason}, status=401)
        for value in access.challenge():
            response.headers.add("WWW-Authenticate", value)
        return response

    return middleware
