"""The active calibration as an OPC UA server (asyncua, ADR 0024): what a PLC, MES or SCADA reads.

Address space (namespace ``[opcua] namespace_uri``, string node ids, ``ns=<i>;s=...``)::

    Objects/Cellcal                                   s=Cellcal
        Cell, Version, State, StateDetail, RunId      String
        RobotConnected, TrackerConnected              Boolean
        ActiveResult                                  s=Cellcal.ActiveResult
            ResultId, Kind, SuspectReason             String
            Created                                   DateTime (UTC)
            Suspect                                   Boolean
            NStations                                 UInt32
            RmsTranslation_mm, RmsRotation_deg        Double
            SigmaTranslation_mm, SigmaRotation_deg    Double (1-sigma of the primary estimate)
            Frames/<name>                             3DFrameType (ns=0), s=Cellcal.ActiveResult.Frames.<name>
                CartesianCoordinates/X, Y, Z          mm (property LengthUnit)
                Orientation/A, B, C                   deg (property AngleUnit), R = Rz(C) Ry(B) Rx(A)
                ParentFrame, ChildFrame               String (cellcal's frame names, ADR 0001)
                Quaternion                            Double[4] (w, x, y, z), w >= 0
                SigmaTranslation_mm, SigmaRotation_deg
            Points/<name>                             3DCartesianCoordinatesType (ns=0): X, Y, Z mm,
                                                      Frame (String), SigmaTranslation_mm
        Drift                                         s=Cellcal.Drift
            ResultId, Status, Action                  String (status ok / warn / fail)
            CheckId                                   UInt32
            DeviationTranslation_mm, DeviationRotation_deg, Cusum_mm,
            WarnTranslation_mm, FailTranslation_mm    Double
            CusumAlarm                                Boolean
            Time                                      DateTime (when the daemon published it)
        RunDriftCheck()  -> ResultId (String), CheckId (UInt32)         role operator
        StartRun(Kind)   -> RunId (String), Planned (UInt32)            role operator

Frames and points are the active result's, by their names on the wire (``cell_T_base``,
``flange_T_target``, ``flange_p_tip`` ...); they appear and go with the result that has them.
Every variable is read-only (AccessLevel CurrentRead; writes are refused before they reach
the address space). ``State``, ``StateDetail`` and ``RunId`` follow the state events (the
heartbeat only until the first one), the device links the heartbeat. Values change when the
daemon's events say so (``on_event`` hands the
newest body of each topic to the server's loop); a client subscribes to them like to any
OPC UA variable; ``ActiveResult.ResultId`` (``Drift.CheckId``) changes last, once every other
variable of the result (the check) has its new value. Until the daemon has a value (no result, no drift check yet) a variable
holds one of its type with status Good: ``""``, 0, False, NaN for a measured number,
:data:`NULL_TIME` (OPC UA's null DateTime, 1601-01-01 UTC) for a time (ADR 0024 decision 7).

Security (``cellcal.daemon.plant.config``)
------------------------------------------
Each session is a user: ``[[opcua.users]]`` (user name and password), ``[[opcua.certificates]]``
(an X.509 user certificate, or the client's application certificate on a secure channel) or,
with ``anonymous = true``, anonymous as ``observer``. The role decides what a session may do,
by the same rule as the ZeroMQ command socket: reads, browsing and subscriptions need a known
user; a method is ``protocol.COMMANDS[cmd].role`` checked with ``protocol.role_allows``
(``start_run`` and ``run_drift_check`` need ``operator``). A call the role does not allow is
refused as a whole with ``BadUserAccessDenied`` before any method runs (the permission
ruleset reads the call's method ids); the method itself checks the role again, then the
arguments (``protocol.validate_args``), then calls the daemon's handler. A handler error
becomes the OPC UA status nearest its code (``E_BUSY`` -> ``BadResourceUnavailable``, ...).

Which client applications may open a session on a secure channel is a trust list
(:class:`_TrustList`, ADR 0024): the ``[[opcua.certificates]]`` files and the ``*.der`` /
``*.pem`` files of ``trusted_certificates_dir``, whole certificates within their validity
dates. asyncua's certificate validator refuses any other at CreateSession
(``BadCertificateUntrusted``, logged with subject and thumbprint); the user manager checks the
channel's own certificate again at ActivateSession. A certificate gives its role only when
proven: a secure channel's (its OpenSecureChannel is signed with the certificate's key) or an
X.509 user token's (signed over the server's certificate and nonce); the certificate a client
names on a ``none`` channel, unsigned, is dropped (:class:`_NoneSecurity`, ADR 0024).
Without ``none`` in ``security``, a channel without security (asyncua opens one for any
client: discovery runs on it) does GetEndpoints and FindServers only; CreateSession,
ActivateSession (before any password is looked at) and every other request are refused
``BadSecurityPolicyRejected`` (:class:`_DiscoveryOnly`, ADR 0024). RegisterServer and
RegisterServer2, a discovery server's services, are refused ``BadServiceUnsupported`` on every
channel (:class:`_NotADiscoveryServer`): FindServers lists this server only.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import hmac
import logging
import math
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, cast

from asyncua import Node, Server, ua
from asyncua.common.instantiate_util import instantiate
from asyncua.common.utils import ServiceError
from asyncua.crypto import uacrypto
from asyncua.crypto.permission_rules import PermissionRuleset, User, UserRole
from asyncua.crypto.security_policies import CryptographyNone, SecurityPolicyFactory, SecurityPolicyNone
from asyncua.server.internal_server import InternalServer
from asyncua.ua.ua_binary import struct_from_binary

from cellcal.daemon import protocol as P
from cellcal.daemon.plant import PLANT_CALLER, DaemonPort, FaultFn, call_command
from cellcal.daemon.plant.config import OpcUa, opcua_host_port, read_secret, trusted_files
from cellcal.daemon.plant.views import as_float, as_int, as_map, frame_mm_deg, point_mm, sigmas

if TYPE_CHECKING:
    from asyncua.common.utils import Buffer
    from cryptography import x509

log = logging.getLogger(__name__)
# asyncua warns, for every frame it instantiates, that the type node has no AccessLevel (a
# variable type has none to copy): normal operation, not a warning for the daemon's journal.
logging.getLogger("asyncua.common.copy_node_util").setLevel(logging.ERROR)

__all__ = ["OpcUaServer", "METHODS", "NULL_TIME", "STATUS_OF", "application_uri"]

#: OPC UA method name -> the protocol command it is.
METHODS = {"RunDriftCheck": "run_drift_check", "StartRun": "start_run"}
#: The protocol's error codes as OPC UA status codes.
STATUS_OF = {
    P.E_BAD_REQUEST: ua.StatusCodes.BadInvalidArgument,
    P.E_FORBIDDEN: ua.StatusCodes.BadUserAccessDenied,
    P.E_NOT_FOUND: ua.StatusCodes.BadNotFound,
    P.E_BUSY: ua.StatusCodes.BadResourceUnavailable,
    P.E_STATE: ua.StatusCodes.BadInvalidState,
    P.E_NO_CALIBRATION: ua.StatusCodes.BadInvalidState,
    P.E_DEVICE: ua.StatusCodes.BadCommunicationError,
    P.E_UNAVAILABLE: ua.StatusCodes.BadServerHalted,
    P.E_INTERNAL: ua.StatusCodes.BadInternalError,
}
_POLICY = {
    "sign_and_encrypt": ua.SecurityPolicyType.Basic256Sha256_SignAndEncrypt,
    "sign": ua.SecurityPolicyType.Basic256Sha256_Sign,
    "none": ua.SecurityPolicyType.NoSecurity,
}
# UNECE codes as OPC UA EUInformation unit ids (OPC 10000-8): MMT millimetre, DD degree.
_UNECE_URI = "http://www.opcfoundation.org/UA/units/un/cefact"
_UNIT_MM = ua.EUInformation(NamespaceUri=_UNECE_URI, UnitId=0x4D4D54, DisplayName=ua.LocalizedText("mm"),
                            Description=ua.LocalizedText("millimetre"))
_UNIT_DEG = ua.EUInformation(NamespaceUri=_UNECE_URI, UnitId=0x4444, DisplayName=ua.LocalizedText("°"),
                             Description=ua.LocalizedText("degree"))
_START_TIMEOUT_S = 30.0
#: OPC UA's null DateTime, what a time variable holds until the daemon has the time (ADR 0024
#: decision 7): encoded as 0 (OPC 10000-6 encodes every time at or before 1601-01-01 so), read
#: back as 1601-01-01 00:00 UTC. asyncua cannot encode a DateTime variant without a value (a
#: read of one answers BadInternalError), so no time variable is ever left without one.
NULL_TIME = ua.FILETIME_EPOCH_AS_UTC_DATETIME

# Request types a known user may send (reads, browsing, subscriptions, session upkeep).
_READ_TYPES = frozenset(ua.NodeId(getattr(ua.ObjectIds, f"{n}Request_Encoding_DefaultBinary")) for n in (
    "Read", "Browse", "BrowseNext", "TranslateBrowsePathsToNodeIds", "CreateSubscription", "ModifySubscription",
    "DeleteSubscriptions", "TransferSubscriptions", "CreateMonitoredItems", "ModifyMonitoredItems",
    "DeleteMonitoredItems", "SetMonitoringMode", "SetPublishingMode", "Publish", "Republish", "RegisterNodes",
    "UnregisterNodes", "CloseSession", "CloseSecureChannel", "GetEndpoints", "FindServers", "HistoryRead",
))
_CALL = ua.NodeId(ua.ObjectIds.CallRequest_Encoding_DefaultBinary)
# What a channel without security may do on a server that offers no none endpoint: find the
# secure endpoint (asyncua answers GetEndpoints and FindServers without asking the ruleset;
# listed for the day it does) and close.
_DISCOVERY_TYPES = frozenset(ua.NodeId(getattr(ua.ObjectIds, f"{n}Request_Encoding_DefaultBinary")) for n in (
    "GetEndpoints", "FindServers", "CloseSecureChannel",
))
# Its answer to anything else: the channel's security policy is what is refused, not a user
# (there is none yet at CreateSession, and a user-shaped refusal would invite other passwords).
_DISCOVERY_ONLY_STATUS = ua.StatusCodes.BadSecurityPolicyRejected
# The answer to RegisterServer / RegisterServer2 on any channel: a discovery server's services,
# which this server is not (the service is what is missing, whoever asks).
_REGISTER_STATUS = ua.StatusCodes.BadServiceUnsupported
#: The caller of the OPC UA request being processed (set by the ruleset, read by the methods:
#: asyncua runs a coroutine method in the task that checked the request).
_CALLER: contextvars.ContextVar[P.Caller | None] = contextvars.ContextVar("cellcal_opcua_caller", default=None)


def application_uri(cell: str) -> str:
    """The server's application URI (its certificate's subjectAltName URI must be this)."""
    return f"urn:cellcal:{cell}"


def _describe(cert: x509.Certificate) -> str:
    """Who a certificate says it is, for the journal: subject, SHA-1 thumbprint (OPC UA's), truncated."""
    try:
        subject = cert.subject.rfc4514_string()
    except ValueError:  # a malformed name must not stop the refusal being logged
        subject = "?"
    # OPC UA's certificate thumbprint is the SHA-1 of its DER.
    thumb = hashlib.sha1(uacrypto.der_from_x509(cert), usedforsecurity=False).hexdigest()
    return f"subject={subject[:120]!r} sha1={thumb}"


class _NoneSecurity(SecurityPolicyNone):
    """asyncua's policy of a channel without security, without the certificate the client names.

    OpenSecureChannel of security policy None is not signed, so the sender certificate in its
    header proves nothing: anyone may copy a listed (public) certificate there. asyncua's
    ``SecurityPolicyNone`` keeps it as the channel's ``peer_certificate``, which asyncua hands
    the user manager at ActivateSession as it hands a secure channel's (whose OpenSecureChannel
    was signed with its key). Here it is dropped, and logged (a conforming client sends none):
    on this channel only an X.509 user token's certificate, whose signature asyncua checks,
    reaches :meth:`_Users.get_user`. asyncua makes a channel's policy at OpenSecureChannel with
    ``SecurityPolicyFactory.create(peer_certificate)``, this class's constructor, twice (when
    the message arrives and when it is processed): the warning comes twice per channel.
    """

    def __init__(self, peer_cert: object = None, host_cert: object = None, host_privkey: object = None,
                 mode: ua.MessageSecurityMode = ua.MessageSecurityMode.None_, permission_ruleset: object = None,
                 host_cert_chain: object = None) -> None:
        if peer_cert:
            try:
                cert = uacrypto.x509_from_der(peer_cert) if isinstance(peer_cert, bytes) else peer_cert
                who = _describe(cast("x509.Certificate", cert))
            except ValueError:  # not a certificate at all: dropped the same
                who = "not a certificate"
            log.warning("opcua: certificate named on a channel without security ignored (unsigned, proves "
                        "nothing): %s", who)
        super().__init__(None, host_cert, host_privkey, mode, permission_ruleset=permission_ruleset,
                         host_cert_chain=host_cert_chain)


def _discovery_only(what: str) -> ServiceError:
    log.warning("opcua: %s refused on a channel without security: this server offers no none endpoint, "
                "such a channel is for discovery only (GetEndpoints, FindServers)", what)
    return ServiceError(_DISCOVERY_ONLY_STATUS)


class _NotADiscoveryServer(InternalServer):
    """asyncua's internal server without the discovery server's RegisterServer / RegisterServer2.

    asyncua answers both on any channel, secure or not, with or without a session, without
    asking a ruleset (``UaProcessor._process_message``), and lists what was registered in its
    FindServers answers: any client could put a server of its own (a fake cell) where a PLC
    looks for this one. A cellcal server registers nobody; the request is refused with
    ``BadServiceUnsupported`` (asyncua turns the ServiceError into the request's service
    fault) and logged. Given to ``Server(iserver=...)``, its public parameter.
    """

    def register_server(self, server: object, conf: object = None) -> None:
        uri = str(getattr(server, "ServerUri", "?"))[:120]
        log.warning("opcua: RegisterServer of %r refused: this server is not a discovery server", uri)
        raise ServiceError(_REGISTER_STATUS)

    def register_server2(self, params: ua.RegisterServer2Parameters) -> None:
        # asyncua's own register_server2 calls register_server; refused here as well, so that
        # neither depends on the other.
        uri = str(getattr(params.Server, "ServerUri", "?"))[:120]
        log.warning("opcua: RegisterServer2 of %r refused: this server is not a discovery server", uri)
        raise ServiceError(_REGISTER_STATUS)


class _NoSessionRules(PermissionRuleset):
    """The ruleset of a discovery-only channel: no request of a session passes.

    asyncua asks it for every request of a channel that has a session, except CreateSession,
    ActivateSession, CloseSession, discovery and RegisterServer / RegisterServer2
    (``UaProcessor._process_message``; the last two :class:`_NotADiscoveryServer` refuses on
    every channel); a request without a session is refused by asyncua
    itself (``BadUserAccessDenied``). It raises
    rather than returns False so that the client gets the channel's status, not asyncua's
    ``BadUserAccessDenied``.
    """

    def check_validity(self, user: User | None, action_type_id: ua.NodeId, body: Buffer) -> bool:
        if action_type_id in _DISCOVERY_TYPES:
            return True
        raise _discovery_only(f"request {action_type_id.to_string()}")


class _NoActivation(CryptographyNone):
    """The asymmetric cryptography of a discovery-only channel: no signature verifies.

    On a channel without security asyncua calls ``verify`` only at ActivateSession, on the
    client's signature and before it decodes the user token or asks the user manager: the
    password is never looked at (no guessing on such a channel). Messages themselves are not
    verified (``vsignature_size`` is 0), and OpenSecureChannel's answer is made with
    ``signature``, unchanged.
    """

    def verify(self, data: bytes, signature: bytes) -> None:
        raise _discovery_only("ActivateSession")


class _DiscoveryOnly(_NoneSecurity):
    """The policy of a channel without security on a server that offers no ``none`` endpoint.

    A client opens such a channel to ask for the endpoints (OPC 10000-4 5.4), so asyncua opens
    one whatever the server offers: with no factory of security policy None the connection
    keeps the ``SecurityPolicyNone`` it starts with, which has no ruleset and let a client
    with no certificate open a session and read, its password in clear. Here every session
    step is refused with ``BadSecurityPolicyRejected``: CreateSession (below), ActivateSession
    (:class:`_NoActivation`), any other request (:class:`_NoSessionRules`, whatever ruleset
    the factory gives).
    """

    def __init__(self, peer_cert: object = None, host_cert: object = None, host_privkey: object = None,
                 mode: ua.MessageSecurityMode = ua.MessageSecurityMode.None_, permission_ruleset: object = None,
                 host_cert_chain: object = None) -> None:
        super().__init__(peer_cert, host_cert, host_privkey, mode, permission_ruleset=_NoSessionRules(),
                         host_cert_chain=host_cert_chain)
        self.asymmetric_cryptography = _NoActivation()

    # asyncua reads a channel policy's AsymmetricSignatureURI only to sign its CreateSession
    # answer (the session is registered by then and goes with the connection, as one refused
    # by the trust list does): raising here turns that answer into the refusal.
    @property
    def AsymmetricSignatureURI(self) -> str:  # noqa: N802 - asyncua's name
        raise _discovery_only("CreateSession")


class _TrustList:
    """The client application certificates that may open a session on a secure channel.

    The ``[[opcua.certificates]]`` files and the ``*.der`` / ``*.pem`` files of
    ``trusted_certificates_dir``, read at start, compared as whole certificates (DER): no
    chain, no issuer is trusted on behalf of another certificate. asyncua calls
    :meth:`validate` (its ``CertificateValidatorMethod``, ``Server.set_certificate_validator``)
    with the certificate a client sends in CreateSession; :meth:`trusted` is asked again at
    ActivateSession for the secure channel's own certificate (a client may send another one,
    or none, in CreateSession).
    """

    def __init__(self, cfg: OpcUa) -> None:
        self._files = [Path(c.file) for c in cfg.certificates]
        self._dir = cfg.trusted_certificates_dir
        self._der: set[bytes] = set()

    async def load(self) -> None:
        files = list(self._files)
        if self._dir:
            files += trusted_files(self._dir)
        for path in files:
            self._der.add(uacrypto.der_from_x509(await uacrypto.load_certificate(path)))
        log.info("opcua: %d client certificate(s) on the trust list", len(self._der))

    def trusted(self, der: bytes) -> bool:
        return any(hmac.compare_digest(known, der) for known in self._der)

    def refuse(self, cert: x509.Certificate, why: str) -> None:
        log.warning("opcua: client certificate refused (%s): %s", why, _describe(cert))

    async def validate(self, cert: x509.Certificate, app: ua.ApplicationDescription) -> None:
        if not self.trusted(uacrypto.der_from_x509(cert)):
            self.refuse(cert, f"not on the trust list, application {str(app.ApplicationUri)[:120]!r}")
            raise ServiceError(ua.StatusCodes.BadCertificateUntrusted)
        now = datetime.now(UTC)
        if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
            self.refuse(cert, f"not valid now, {cert.not_valid_before_utc:%Y-%m-%d} to {cert.not_valid_after_utc:%Y-%m-%d}")
            raise ServiceError(ua.StatusCodes.BadCertificateTimeInvalid)


class _Users:
    """asyncua user manager: configured passwords and certificates, anonymous if allowed."""

    def __init__(self, cfg: OpcUa) -> None:
        self.roles: dict[str, str] = {}   # asyncua user name -> cellcal role
        self._passwords: dict[str, bytes] = {}
        self._certs: list[tuple[bytes, str]] = []
        for i, u in enumerate(cfg.users):
            self._passwords[u.name] = read_secret(u.password_file, f"opcua.users[{i}].password_file").encode()
            self.roles[f"user:{u.name}"] = u.role
        self._cert_files = [(c.file, c.name, c.role) for c in cfg.certificates]
        self.anonymous = cfg.anonymous
        if cfg.anonymous:
            self.roles["anonymous"] = P.ROLE_OBSERVER
        self.trust = _TrustList(cfg)

    async def load(self) -> None:
        await self.trust.load()
        for path, name, role in self._cert_files:
            cert = await uacrypto.load_certificate(Path(path))
            self._certs.append((uacrypto.der_from_x509(cert), f"cert:{name}"))
            self.roles[f"cert:{name}"] = role

    def get_user(self, iserver: InternalServer, username: str | None = None, password: str | bytes | None = None,
                 certificate: object = None) -> User | None:
        # ``certificate`` is the secure channel's (or an X.509 user token's, which must be a
        # [[opcua.certificates]] one, so on the list too): whatever the user, a certificate off
        # the trust list ends the session here, even if CreateSession carried another one.
        # Both are proven; a channel without security has none (_NoneSecurity drops what its
        # client names), so asyncua gives None or empty bytes unless a user token carries one.
        if certificate:
            der = certificate if isinstance(certificate, bytes) else uacrypto.der_from_x509(certificate)
            if not self.trust.trusted(der):
                self.trust.refuse(uacrypto.x509_from_der(der), "at ActivateSession, not on the trust list")
                return None
        if username is not None:
            want = self._passwords.get(username)
            got = password.encode() if isinstance(password, str) else bytes(password or b"")
            if want is not None and hmac.compare_digest(want, got):
                return User(role=UserRole.User, name=f"user:{username}")
            log.warning("opcua: user %r refused (unknown user or wrong password)", username[:64])
            return None
        if certificate is not None:
            der = certificate if isinstance(certificate, bytes) else uacrypto.der_from_x509(certificate)
            for known, name in self._certs:
                if hmac.compare_digest(known, der):
                    return User(role=UserRole.User, name=name)
        if self.anonymous:
            return User(role=UserRole.User, name="anonymous")
        return None


class _Rules(PermissionRuleset):
    """Who may send which request: the cellcal roles, not asyncua's admin/user split."""

    def __init__(self, roles: Mapping[str, str], methods: dict[ua.NodeId, str]) -> None:
        self.roles = roles
        self.methods = methods   # method node id -> protocol command

    def check_validity(self, user: User | None, action_type_id: ua.NodeId, body: Buffer) -> bool:
        name = getattr(user, "name", None)
        role = self.roles.get(name) if name else None
        if role is None:
            return False  # not a session we activated (or a user no longer configured)
        caller = P.Caller(key_id=f"opcua:{name}", role=role, name=str(name).split(":", 1)[-1])
        _CALLER.set(caller)
        if action_type_id in _READ_TYPES:
            return True
        if action_type_id == _CALL:
            try:
                params = struct_from_binary(ua.CallParameters, body.copy())
            except Exception:  # noqa: BLE001 - malformed: refused, never a crash
                return False
            for m in params.MethodsToCall:
                cmd = self.methods.get(m.MethodId)
                if cmd is not None and not P.role_allows(role, P.COMMANDS[cmd].role):
                    log.warning("opcua: cmd %s key=%s role=%s -> E_FORBIDDEN", cmd, caller.key_id, role)
                    return False
            return True
        return False  # writes, node management, history updates: nobody


def _table(*rows: tuple[str, object, ua.VariantType]) -> tuple[tuple[str, object, ua.VariantType], ...]:
    """Rows of (browse name, initial value, variant type) for the address space."""
    return rows


def _dt(ns: object) -> datetime | None:
    return datetime.fromtimestamp(as_float(ns) * 1e-9, tz=UTC) if ns else None


class OpcUaServer:
    """``[opcua]``: the OPC UA server of one daemon (module docstring).

    Parameters
    ----------
    cfg : OpcUa
        The ``[opcua]`` section.
    port : DaemonPort
    fault : callable(interface, message, *, active, retry_in_s=None)
    """

    name = "opcua"

    def __init__(self, cfg: OpcUa, port: DaemonPort, fault: FaultFn) -> None:
        self.cfg = cfg
        self.port = port
        self._fault = fault
        self.host, self.port_number = opcua_host_port(cfg)
        self._users = _Users(cfg)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._latest: dict[str, Mapping[str, object]] = {}
        self._latest_lock = threading.Lock()
        self._wake: asyncio.Event | None = None
        self._stop: asyncio.Event | None = None
        self.ns = 0
        self._server: Server | None = None
        self._vars: dict[str, tuple[Node, ua.VariantType]] = {}   # path -> (variable, its type)
        self._frames: dict[str, Node] = {}
        self._points: dict[str, Node] = {}
        self.updates = 0
        self._seen_state = False

    @property
    def endpoint(self) -> str:
        return self.cfg.endpoint

    # ---- the daemon's side ---------------------------------------------------------------------
    def on_event(self, topic: str, body: Mapping[str, object]) -> None:
        if topic not in (P.TOPIC_HEARTBEAT, P.TOPIC_RESULT, P.TOPIC_DRIFT, P.TOPIC_STATE):
            return
        if topic == P.TOPIC_RESULT and not body.get("active"):
            return
        with self._latest_lock:
            self._latest[topic] = body  # only the newest of each topic matters to a variable
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:  # the loop closed: the server is stopping
                pass

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._thread_main, name="cellcal-opcua", daemon=True)
        self._thread.start()
        if not self._started.wait(_START_TIMEOUT_S):
            raise TimeoutError(f"opcua: the server did not start within {_START_TIMEOUT_S:g} s")
        if self._error is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
            raise self._error

    def stop(self) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=10.0)
            if self._thread.is_alive():
                log.warning("opcua: the server thread did not stop in time")
            self._thread = None

    # ---- the server's loop -------------------------------------------------------------------------
    def _thread_main(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # noqa: BLE001 - reported to start() or logged
            if not self._started.is_set():
                self._error = exc
            else:
                log.exception("opcua: the server stopped on an error")
                self._fault(self.name, f"server stopped: {type(exc).__name__}: {exc}", active=True)
        finally:
            self._loop = None
            self._started.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake, self._stop = asyncio.Event(), asyncio.Event()
        server = await self._build()
        await server.start()
        self._server = server
        log.info("opcua: serving %s (%s)", self.cfg.endpoint, ", ".join(self.cfg.security))
        self._started.set()
        try:
            await self._initial()
            while not self._stop.is_set():
                waiter = asyncio.ensure_future(self._wake.wait())
                stopper = asyncio.ensure_future(self._stop.wait())
                await asyncio.wait({waiter, stopper}, timeout=self.cfg.update_s * 20,
                                   return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                stopper.cancel()
                self._wake.clear()
                await self._apply()
                await asyncio.sleep(self.cfg.update_s)  # at most one round of writes per period
        finally:
            await server.stop()

    async def _build(self) -> Server:
        await self._users.load()
        # RegisterServer / RegisterServer2 refused on every channel (_NotADiscoveryServer).
        server = Server(iserver=_NotADiscoveryServer(user_manager=self._users))
        await server.init()
        server.set_endpoint(self.cfg.endpoint)
        server.set_server_name(f"cellcal {self.port.cell}")
        await server.set_application_uri(application_uri(self.port.cell))
        tokens: list[type] = []
        if self.cfg.anonymous:
            tokens.append(ua.AnonymousIdentityToken)
        if self.cfg.users:
            tokens.append(ua.UserNameIdentityToken)
        if self.cfg.certificates:
            tokens.append(ua.X509IdentityToken)
        server.set_identity_tokens(tokens)
        if self.cfg.certificate_file:
            await server.load_certificate(self.cfg.certificate_file)
            await server.load_private_key(self.cfg.private_key_file)
        self.ns = await server.register_namespace(self.cfg.namespace_uri)
        methods = await self._address_space(server)
        rules = _Rules(self._users.roles, methods)
        server.set_security_policy([_POLICY[m] for m in self.cfg.security], permission_ruleset=rules)
        # Channels of security policy None get _NoneSecurity (the none endpoint) or, when the
        # server offers no none endpoint, _DiscoveryOnly: asyncua opens such a channel either
        # way (discovery runs on one) and would give it its own SecurityPolicyNone, without
        # a ruleset when none is not configured. asyncua has no public way to choose a policy
        # class: Server.start appends one SecurityPolicyFactory per SecurityPolicyType to its
        # private ``_policies`` (the class from security_policies.SECURITY_POLICY_TYPE_MAP, a
        # process-wide table), and a channel takes the first factory matching its policy URI
        # and mode. Ours, appended before start with what asyncua gives its own (the server's
        # certificate and key, the ruleset), comes first. The one private attribute touched
        # here; test_a_certificate_named_on_the_none_endpoint_takes_no_role and
        # test_without_the_none_endpoint_a_channel_without_security_does_discovery_only fail
        # if it stops working.
        none_policy = _NoneSecurity if "none" in self.cfg.security else _DiscoveryOnly
        server._policies.append(SecurityPolicyFactory(
            none_policy, ua.MessageSecurityMode.None_, server.iserver.certificate, server.iserver.private_key,
            permission_ruleset=rules))
        # The trust list of client application certificates (module docstring, Security).
        server.set_certificate_validator(self._users.trust.validate)
        return server

    def _id(self, path: str) -> ua.NodeId:
        return ua.NodeId(path, self.ns)

    async def _var(self, parent: Node, path: str, name: str, value: object, vtype: ua.VariantType) -> Node:
        node = await parent.add_variable(self._id(path), ua.QualifiedName(name, self.ns), ua.Variant(value, vtype))
        self._vars[path] = (node, vtype)
        return node

    async def _address_space(self, server: Server) -> dict[ua.NodeId, str]:
        S, B, D, U, T = (ua.VariantType.String, ua.VariantType.Boolean, ua.VariantType.Double, ua.VariantType.UInt32,
                         ua.VariantType.DateTime)
        root = await server.nodes.objects.add_object(self._id("Cellcal"), ua.QualifiedName("Cellcal", self.ns))
        for name, value, vt in _table(("Cell", self.port.cell, S), ("Version", self.port.version, S), ("State", "", S),
                                ("StateDetail", "", S), ("RunId", "", S), ("RobotConnected", False, B),
                                ("TrackerConnected", False, B)):
            await self._var(root, f"Cellcal.{name}", name, value, vt)
        # Until there is a result (a drift check): "" and 0, NaN for a measured number (0.0 would
        # read as a perfect fit), NULL_TIME for a time; every variable has a value of its type
        # from creation, so a client reading before the first result gets no error (decision 7).
        nan = math.nan
        res = await root.add_object(self._id("Cellcal.ActiveResult"), ua.QualifiedName("ActiveResult", self.ns))
        for name, value, vt in _table(("ResultId", "", S), ("Kind", "", S), ("Created", NULL_TIME, T),
                                ("Suspect", False, B), ("SuspectReason", "", S), ("NStations", 0, U),
                                ("RmsTranslation_mm", nan, D), ("RmsRotation_deg", nan, D),
                                ("SigmaTranslation_mm", nan, D), ("SigmaRotation_deg", nan, D)):
            await self._var(res, f"Cellcal.ActiveResult.{name}", name, value, vt)
        self._frames_folder = await res.add_object(self._id("Cellcal.ActiveResult.Frames"),
                                                   ua.QualifiedName("Frames", self.ns))
        self._points_folder = await res.add_object(self._id("Cellcal.ActiveResult.Points"),
                                                   ua.QualifiedName("Points", self.ns))
        drift = await root.add_object(self._id("Cellcal.Drift"), ua.QualifiedName("Drift", self.ns))
        for name, value, vt in _table(("ResultId", "", S), ("Status", "", S), ("Action", "", S), ("CheckId", 0, U),
                                ("DeviationTranslation_mm", nan, D), ("DeviationRotation_deg", nan, D),
                                ("Cusum_mm", nan, D), ("WarnTranslation_mm", nan, D), ("FailTranslation_mm", nan, D),
                                ("CusumAlarm", False, B), ("Time", NULL_TIME, T)):
            await self._var(drift, f"Cellcal.Drift.{name}", name, value, vt)

        def arg(name: str, vt: ua.VariantType, doc: str) -> ua.Argument:
            a = ua.Argument()
            a.Name = name
            a.DataType = ua.NodeId(vt.value)
            a.ValueRank = -1
            a.Description = ua.LocalizedText(doc)
            return a

        m1 = await root.add_method(self._id("Cellcal.RunDriftCheck"), ua.QualifiedName("RunDriftCheck", self.ns),
                                   self._run_drift_check, [],
                                   [arg("ResultId", S, "the calibration the check measures"),
                                    arg("CheckId", U, "the check_id its drift values will carry")])
        m2 = await root.add_method(self._id("Cellcal.StartRun"), ua.QualifiedName("StartRun", self.ns),
                                   self._start_run, [arg("Kind", S, "base_frame, tool_point, hand_eye or kinematics")],
                                   [arg("RunId", S, "the run started"), arg("Planned", U, "stations planned")])
        return {m1.nodeid: METHODS["RunDriftCheck"], m2.nodeid: METHODS["StartRun"]}

    # ---- methods -------------------------------------------------------------------------------------
    async def _call(self, cmd: str, args: Mapping[str, object]) -> tuple[object, ua.StatusCode | None]:
        caller = _CALLER.get()
        if caller is None:  # the ruleset did not see this call: refuse rather than guess who it is
            return None, ua.StatusCode(ua.StatusCodes.BadUserAccessDenied)
        loop = asyncio.get_running_loop()
        try:
            # The handler may touch the store: off the server's loop.
            result = await loop.run_in_executor(None, call_command, self.port, cmd, args, caller)
        except P.CommandError as exc:
            log.info("opcua: %s by %s -> %s: %s", cmd, caller.name, exc.code, exc.message)
            return None, ua.StatusCode(STATUS_OF.get(exc.code, ua.StatusCodes.BadInternalError))
        except Exception:  # noqa: BLE001 - a bug: logged, a status for the client
            log.exception("opcua: %s by %s failed", cmd, caller.name)
            return None, ua.StatusCode(ua.StatusCodes.BadInternalError)
        return result, None

    async def _run_drift_check(self, parent: ua.NodeId) -> list[ua.Variant] | ua.StatusCode:
        result, status = await self._call("run_drift_check", {})
        if status is not None:
            return status
        # The handler's run_drift_check result (protocol.DriftCheckResult).
        r = cast(P.DriftCheckResult, result)
        return [ua.Variant(str(r["result_id"]), ua.VariantType.String),
                ua.Variant(int(r["check_id"]), ua.VariantType.UInt32)]

    async def _start_run(self, parent: ua.NodeId, kind: object = None) -> list[ua.Variant] | ua.StatusCode:
        value = kind.Value if isinstance(kind, ua.Variant) else kind
        result, status = await self._call("start_run", {"kind": value})
        if status is not None:
            return status
        # The handler's start_run result (protocol.StartRunResult).
        r = cast(P.StartRunResult, result)
        return [ua.Variant(str(r["run_id"]), ua.VariantType.String),
                ua.Variant(int(r["planned"]), ua.VariantType.UInt32)]

    # ---- values ----------------------------------------------------------------------------------------
    async def _set(self, path: str, value: object) -> None:
        node, vt = self._vars[path]
        if vt == ua.VariantType.Double:
            value = as_float(value) if value is not None and math.isfinite(as_float(value)) else math.nan
        elif vt == ua.VariantType.DateTime and value is None:
            value = NULL_TIME  # a body without its time (created_ns): null, never a value asyncua cannot encode
        await node.write_value(ua.DataValue(ua.Variant(value, vt)))

    async def _initial(self) -> None:
        try:
            st = await asyncio.get_running_loop().run_in_executor(None, self.port.status)
            active = await asyncio.get_running_loop().run_in_executor(
                None, call_command, self.port, "get_result", {}, PLANT_CALLER)
        except P.CommandError:
            active = None
        with self._latest_lock:
            self._latest.setdefault(P.TOPIC_HEARTBEAT, st)
            if isinstance(active, Mapping):  # the active result's body (None: there is none)
                self._latest.setdefault(P.TOPIC_RESULT, active)
            last_drift = st.get("last_drift")
            if last_drift and isinstance(last_drift, Mapping):
                self._latest.setdefault(P.TOPIC_DRIFT, last_drift)
        await self._apply()

    async def _apply(self) -> None:
        with self._latest_lock:
            latest, self._latest = self._latest, {}
        try:
            if P.TOPIC_HEARTBEAT in latest:
                await self._heartbeat(latest[P.TOPIC_HEARTBEAT])
            if P.TOPIC_STATE in latest:
                self._seen_state = True
                b = latest[P.TOPIC_STATE]
                await self._set("Cellcal.State", str(b.get("state", "")))
                await self._set("Cellcal.StateDetail", str(b.get("reason", "")))
                await self._set("Cellcal.RunId", str(b.get("run_id") or ""))
            if P.TOPIC_RESULT in latest:
                await self._result(latest[P.TOPIC_RESULT])
            if P.TOPIC_DRIFT in latest:
                await self._drift(latest[P.TOPIC_DRIFT])
            self.updates += 1
        except Exception:  # noqa: BLE001 - one bad body must not end the server
            log.exception("opcua: updating the address space failed")

    async def _heartbeat(self, hb: Mapping[str, object]) -> None:
        if not self._seen_state:
            # The state comes from the state events once there is one: a heartbeat built just
            # before a transition can arrive after it, and must not put the old state back.
            await self._set("Cellcal.State", str(hb.get("state", "")))
            await self._set("Cellcal.StateDetail", str(hb.get("detail", "")))
            await self._set("Cellcal.RunId", str(hb.get("run_id") or ""))
        devices = as_map(hb.get("devices"))
        await self._set("Cellcal.RobotConnected", bool(as_map(devices.get("robot")).get("connected")))
        await self._set("Cellcal.TrackerConnected", bool(as_map(devices.get("tracker")).get("connected")))

    async def _result(self, r: Mapping[str, object]) -> None:
        p = "Cellcal.ActiveResult."
        await self._set(p + "Kind", str(r.get("kind", "")))
        await self._set(p + "Created", _dt(r.get("created_ns")))
        await self._set(p + "Suspect", bool(r.get("suspect")))
        await self._set(p + "SuspectReason", str(r.get("suspect_reason") or ""))
        await self._set(p + "NStations", as_int(r.get("n_stations", 0)))
        await self._set(p + "RmsTranslation_mm", as_float(r.get("rms_translation_m", math.nan)) * 1e3)
        await self._set(p + "RmsRotation_deg", math.degrees(as_float(r.get("rms_rotation_rad", math.nan))))
        unc = as_map(r.get("uncertainty"))
        st, sr = unc.get("sigma_translation_m"), unc.get("sigma_rotation_rad")
        await self._set(p + "SigmaTranslation_mm", None if st is None else as_float(st) * 1e3)
        await self._set(p + "SigmaRotation_deg", None if sr is None else math.degrees(as_float(sr)))
        transforms = as_map(r.get("transforms"))
        points = as_map(r.get("points"))
        server = self._server
        assert server is not None  # _main serves before it applies a body
        for name in [n for n in self._frames if n not in transforms]:
            await server.delete_nodes([self._frames.pop(name)], recursive=True)
        for name in [n for n in self._points if n not in points]:
            await server.delete_nodes([self._points.pop(name)], recursive=True)
        for name, tr in transforms.items():
            await self._frame(server, name, as_map(tr), sigmas(r, name))
        for name, pt in points.items():
            await self._point(server, name, as_map(pt), sigmas(r, name)[0])
        # The id last: a client that sees the new ResultId reads the whole new result (the
        # variables are written one by one; the id is the commit mark).
        await self._set(p + "ResultId", str(r.get("result_id", "")))

    async def _frame(self, server: Server, name: str, tr: Mapping[str, object],
                     sig: tuple[float | None, float | None]) -> None:
        base = f"Cellcal.ActiveResult.Frames.{name}"
        if name not in self._frames:
            ftype = server.get_node(ua.NodeId(ua.ObjectIds.ThreeDFrameType))
            nodes = await instantiate(self._frames_folder, ftype, nodeid=self._id(base),
                                      bname=ua.QualifiedName(name, self.ns), idx=self.ns)
            frame = nodes[0]
            self._frames[name] = frame
            by_path = {n.nodeid.Identifier: n for n in nodes if isinstance(n.nodeid.Identifier, str)}
            for axis in "XYZ":
                self._vars[f"{base}.CartesianCoordinates.{axis}"] = (by_path[f"{base}.CartesianCoordinates.{axis}"],
                                                                    ua.VariantType.Double)
            for axis in "ABC":
                self._vars[f"{base}.Orientation.{axis}"] = (by_path[f"{base}.Orientation.{axis}"], ua.VariantType.Double)
            await by_path[f"{base}.CartesianCoordinates"].add_property(
                self._id(f"{base}.CartesianCoordinates.LengthUnit"), "LengthUnit", _UNIT_MM)
            await by_path[f"{base}.Orientation"].add_property(
                self._id(f"{base}.Orientation.AngleUnit"), "AngleUnit", _UNIT_DEG)
            for leaf in ("Constant", "FixedBase"):
                if f"{base}.{leaf}" in by_path:
                    await by_path[f"{base}.{leaf}"].write_value(ua.Variant(True, ua.VariantType.Boolean))
            S, D = ua.VariantType.String, ua.VariantType.Double
            await self._var(frame, f"{base}.ParentFrame", "ParentFrame", "", S)
            await self._var(frame, f"{base}.ChildFrame", "ChildFrame", "", S)
            await self._var(frame, f"{base}.Quaternion", "Quaternion", [1.0, 0.0, 0.0, 0.0], D)
            await self._var(frame, f"{base}.SigmaTranslation_mm", "SigmaTranslation_mm", 0.0, D)
            await self._var(frame, f"{base}.SigmaRotation_deg", "SigmaRotation_deg", 0.0, D)
        x, y, z, a, b, c = frame_mm_deg(tr)
        value = ua.ThreeDFrame(CartesianCoordinates=ua.ThreeDCartesianCoordinates(X=x, Y=y, Z=z),
                               Orientation=ua.ThreeDOrientation(A=a, B=b, C=c))
        await self._frames[name].write_value(ua.DataValue(ua.Variant(value, ua.VariantType.ExtensionObject)))
        for axis, v in zip("XYZ", (x, y, z), strict=True):
            await self._set(f"{base}.CartesianCoordinates.{axis}", v)
        for axis, v in zip("ABC", (a, b, c), strict=True):
            await self._set(f"{base}.Orientation.{axis}", v)
        q = as_map(tr.get("quaternion"))
        await self._set(f"{base}.ParentFrame", str(tr.get("parent_frame", "")))
        await self._set(f"{base}.ChildFrame", str(tr.get("child_frame", "")))
        node, _vt = self._vars[f"{base}.Quaternion"]
        await node.write_value(ua.DataValue(ua.Variant([as_float(q.get(k, math.nan)) for k in "wxyz"], ua.VariantType.Double)))
        await self._set(f"{base}.SigmaTranslation_mm", None if sig[0] is None else sig[0] * 1e3)
        await self._set(f"{base}.SigmaRotation_deg", None if sig[1] is None else math.degrees(sig[1]))

    async def _point(self, server: Server, name: str, pt: Mapping[str, object], sigma_m: float | None) -> None:
        base = f"Cellcal.ActiveResult.Points.{name}"
        if name not in self._points:
            ptype = server.get_node(ua.NodeId(ua.ObjectIds.ThreeDCartesianCoordinatesType))
            nodes = await instantiate(self._points_folder, ptype, nodeid=self._id(base),
                                      bname=ua.QualifiedName(name, self.ns), idx=self.ns)
            self._points[name] = nodes[0]
            by_path = {n.nodeid.Identifier: n for n in nodes if isinstance(n.nodeid.Identifier, str)}
            for axis in "XYZ":
                self._vars[f"{base}.{axis}"] = (by_path[f"{base}.{axis}"], ua.VariantType.Double)
            await nodes[0].add_property(self._id(f"{base}.LengthUnit"), "LengthUnit", _UNIT_MM)
            await self._var(nodes[0], f"{base}.Frame", "Frame", "", ua.VariantType.String)
            await self._var(nodes[0], f"{base}.SigmaTranslation_mm", "SigmaTranslation_mm", 0.0, ua.VariantType.Double)
        x, y, z = point_mm(pt)
        value = ua.ThreeDCartesianCoordinates(X=x, Y=y, Z=z)
        await self._points[name].write_value(ua.DataValue(ua.Variant(value, ua.VariantType.ExtensionObject)))
        for axis, v in zip("XYZ", (x, y, z), strict=True):
            await self._set(f"{base}.{axis}", v)
        await self._set(f"{base}.Frame", str(pt.get("frame", "")))
        await self._set(f"{base}.SigmaTranslation_mm", None if sigma_m is None else sigma_m * 1e3)

    async def _drift(self, d: Mapping[str, object]) -> None:
        p = "Cellcal.Drift."
        cusum = as_map(d.get("cusum"))
        r = d.get("deviation_rotation_rad")
        await self._set(p + "ResultId", str(d.get("result_id", "")))
        await self._set(p + "Status", str(d.get("status", "")))
        await self._set(p + "Action", str(d.get("action", "")))
        await self._set(p + "DeviationTranslation_mm", as_float(d.get("deviation_translation_m", math.nan)) * 1e3)
        await self._set(p + "DeviationRotation_deg", None if r is None else math.degrees(as_float(r)))
        await self._set(p + "Cusum_mm", as_float(cusum.get("value_m", math.nan)) * 1e3)
        await self._set(p + "WarnTranslation_mm", as_float(d.get("warn_translation_m", math.nan)) * 1e3)
        await self._set(p + "FailTranslation_mm", as_float(d.get("fail_translation_m", math.nan)) * 1e3)
        await self._set(p + "CusumAlarm", bool(cusum.get("alarm")))
        await self._set(p + "Time", datetime.now(UTC))
        await self._set(p + "CheckId", as_int(d.get("check_id", 0)))  # the commit mark, as ResultId above
