"""The OPC UA server read and called by a client nobody here wrote: asyncua's own ``Client``.

One simulated cell for the module (``inprocess_cell``) calibrates once; its ``[opcua]`` section
offers an unencrypted endpoint on loopback (``allow_none_on_loopback``) and Basic256Sha256
SignAndEncrypt with a server certificate made by asyncua's certificate tool, two password
users (``ops`` operator, ``viewer`` observer), one client certificate (``plc``, operator) and
anonymous reads. The client, like a PLC would:

* reads the active result's frames as the standard 3D frame type (mm, A-B-C degrees; the
  test rebuilds the rotation from A, B, C itself), their sigmas, the result id, status and
  state, and the units the frame's properties declare;
* calls ``RunDriftCheck`` as operator, sees the check arrive by a data-change subscription and
  reads the drift the check published; is refused
  ``StartRun`` and ``RunDriftCheck`` as observer and as anonymous, with nothing started;
* cannot write, cannot log in with a wrong password;
* connects on the encrypted endpoint with its certificate and starts a run as ``plc``;
* on the none endpoint, naming plc's certificate in OpenSecureChannel without its key, stays
  anonymous and starts nothing; with an X.509 user token signed with plc's key is ``plc``;
* with an application certificate on no trust list is refused even with a valid password; one
  from ``trusted_certificates_dir`` connects as its password user;
* on a second cell's server offering ``sign_and_encrypt`` only, a channel without security
  finds the secure endpoint and is refused a session (``BadSecurityPolicyRejected``: no
  activation, password unchecked, no read, no browse);
* killed while subscribed, without closing its session, leaves the server serving the next
  client, and its session and subscriptions go at the session timeout;
* cannot register a server of its own (RegisterServer, RegisterServer2) on any channel:
  FindServers lists this server only;
* on a third cell of its own, before any result or drift check, reads every variable without
  an error (the times OPC UA's null DateTime, the numbers NaN), and real values after.
"""

from __future__ import annotations

import asyncio
import logging
import math
import select
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

# asyncua is in the test extra (pip install -e '.[test]'); without it this module fails to import.
from asyncua import Client, ua
from asyncua.crypto.cert_gen import setup_self_signed_certificate
from asyncua.crypto.security_policies import SecurityPolicyBasic256Sha256, SecurityPolicyNone
from conftest import wait_until
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.x509.oid import ExtendedKeyUsageOID

from cellcal.daemon import protocol as P
from cellcal.daemon.plant.opcua import application_uri
from cellcal.daemon.plant.views import sigmas
from cellcal.testing.harness import free_port, inprocess_cell

pytestmark = pytest.mark.slow

NS = "urn:cellcal"
PASSWORDS = {"ops": "ops-secret-1", "viewer": "viewer-secret-2"}


class Cell:
    def __init__(self, cell, url: str, client_cert: Path, client_key: Path, server_cert: Path, body: dict,
                 pki: Path, opcua: dict) -> None:
        self.cell, self.url, self.body = cell, url, body
        self.client_cert, self.client_key, self.server_cert = client_cert, client_key, server_cert
        self.pki = pki   # <name>_cert.der / <name>_key.pem: plc (listed), hmi (trusted dir), stranger (neither)
        self.opcua = opcua   # the [opcua] section the cell runs with


@pytest.fixture(scope="module")
def opc(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("opcua")
    certs = tmp / "pki"
    certs.mkdir()
    server_key, server_cert = certs / "server_key.pem", certs / "server_cert.der"
    client_key, client_cert = certs / "plc_key.pem", certs / "plc_cert.der"
    asyncio.run(setup_self_signed_certificate(server_key, server_cert, application_uri("test-cell"), "localhost",
                                              [ExtendedKeyUsageOID.SERVER_AUTH], {"organizationName": "cellcal tests"}))
    asyncio.run(setup_self_signed_certificate(client_key, client_cert, "urn:plant:plc-7", "localhost",
                                              [ExtendedKeyUsageOID.CLIENT_AUTH], {"organizationName": "plant"}))
    # hmi: trusted by the directory (no role of its own); stranger: on no list.
    trusted = tmp / "trusted"
    trusted.mkdir()
    for name, where in (("hmi", trusted), ("stranger", certs)):
        asyncio.run(setup_self_signed_certificate(certs / f"{name}_key.pem", where / f"{name}_cert.der",
                                                  f"urn:plant:{name}", "localhost", [ExtendedKeyUsageOID.CLIENT_AUTH],
                                                  {"organizationName": "plant"}))
    (certs / "hmi_cert.der").symlink_to(trusted / "hmi_cert.der")
    users = []
    for name, role in (("ops", "operator"), ("viewer", "observer")):
        pw = tmp / f"{name}.password"
        pw.write_text(PASSWORDS[name] + "\n")
        pw.chmod(0o600)
        users.append({"name": name, "role": role, "password_file": str(pw)})
    port = free_port()
    overrides = {"opcua": {
        "enabled": True, "endpoint": f"opc.tcp://127.0.0.1:{port}", "security": ["none", "sign_and_encrypt"],
        "allow_none_on_loopback": True, "certificate_file": str(server_cert), "private_key_file": str(server_key),
        "anonymous": True, "users": users, "certificates": [{"name": "plc", "role": "operator", "file": str(client_cert)}],
        "trusted_certificates_dir": str(trusted), "update_s": 0.05,
    }}
    with inprocess_cell(tmp, n_stations=6, overrides=overrides) as cell:
        run_id = cell.svc.start_run("base_frame", reason="test")
        body = cell.wait_result(run_id)
        assert cell.svc.wait_idle(20.0)
        yield Cell(cell, f"opc.tcp://127.0.0.1:{port}", client_cert, client_key, server_cert, body, certs,
                   overrides["opcua"])


@pytest.fixture(scope="module")
def secure_only(opc, tmp_path_factory):
    """A second cell whose server offers ``sign_and_encrypt`` only (no ``none`` endpoint), with
    the first one's certificates, users and trust list; no calibration (nothing to read but
    the cell's name)."""
    port = free_port()
    section = dict(opc.opcua, endpoint=f"opc.tcp://127.0.0.1:{port}", security=["sign_and_encrypt"],
                   allow_none_on_loopback=False)
    with inprocess_cell(tmp_path_factory.mktemp("opcua_secure"), n_stations=6, zmq=False,
                        overrides={"opcua": section}) as cell:
        yield Cell(cell, section["endpoint"], opc.client_cert, opc.client_key, opc.server_cert, {}, opc.pki, section)


def client(opc: Cell, user: str | None = None, password: str | None = None) -> Client:
    c = Client(opc.url, timeout=20)
    if user is not None:
        c.set_user(user)
        c.set_password(PASSWORDS[user] if password is None else password)
    return c


async def _value(c: Client, ns: int, path: str, timeout_s: float = 20.0, until=None):
    """The value of a node, waiting for it to exist (the address space follows the events)
    and, with ``until``, for it to equal that (the server applies a new result after the
    store has it: a test that just saw the store change waits for the address space)."""
    node = c.get_node(ua.NodeId(path, ns))
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            value = await node.read_value()
            if until is None or value == until or asyncio.get_running_loop().time() > deadline:
                return value
        except ua.UaStatusCodeError:
            if asyncio.get_running_loop().time() > deadline:
                raise
        await asyncio.sleep(0.05)


def _rot(a: float, b: float, c: float) -> np.ndarray:
    """Rz(C) Ry(B) Rx(A), angles in degrees: the test's own reading of the 3D orientation."""
    a, b, c = (math.radians(v) for v in (a, b, c))
    rx = np.array([[1, 0, 0], [0, math.cos(a), -math.sin(a)], [0, math.sin(a), math.cos(a)]])
    ry = np.array([[math.cos(b), 0, math.sin(b)], [0, 1, 0], [-math.sin(b), 0, math.cos(b)]])
    rz = np.array([[math.cos(c), -math.sin(c), 0], [math.sin(c), math.cos(c), 0], [0, 0, 1]])
    return rz @ ry @ rx


def test_a_client_reads_the_active_results_frames_sigmas_and_status(opc):
    body = opc.body

    async def read() -> None:
        async with client(opc, "viewer") as c:
            ns = await c.get_namespace_index(NS)
            assert await _value(c, ns, "Cellcal.ActiveResult.ResultId", until=body["result_id"]) == body["result_id"]
            assert await _value(c, ns, "Cellcal.ActiveResult.Kind") == "base_frame"
            assert await _value(c, ns, "Cellcal.ActiveResult.Suspect") is False
            assert await _value(c, ns, "Cellcal.ActiveResult.NStations") == 6
            await wait_async(lambda: _value(c, ns, "Cellcal.State"), "IDLE")  # the last state event applied
            assert await _value(c, ns, "Cellcal.RobotConnected") is True
            for name, tr in body["transforms"].items():
                base = f"Cellcal.ActiveResult.Frames.{name}"
                frame = await _value(c, ns, base)
                # The standard type: 3DFrame (ns=0) with cartesian coordinates and orientation.
                assert isinstance(frame, ua.ThreeDFrame)
                node = c.get_node(ua.NodeId(base, ns))
                assert (await node.read_data_type()) == ua.NodeId(ua.ObjectIds.ThreeDFrame)
                assert (await node.read_type_definition()) == ua.NodeId(ua.ObjectIds.ThreeDFrameType)
                M = np.array(tr["matrix"]).reshape(4, 4)
                xyz = frame.CartesianCoordinates
                assert np.allclose([xyz.X, xyz.Y, xyz.Z], M[:3, 3] * 1e3, atol=1e-9)
                o = frame.Orientation
                assert np.allclose(_rot(o.A, o.B, o.C), M[:3, :3], atol=1e-9)
                # The components are variables too, with their units.
                assert await _value(c, ns, f"{base}.CartesianCoordinates.X") == pytest.approx(xyz.X)
                assert await _value(c, ns, f"{base}.Orientation.C") == pytest.approx(o.C)
                unit = await _value(c, ns, f"{base}.CartesianCoordinates.LengthUnit")
                assert unit.DisplayName.Text == "mm"
                assert (await _value(c, ns, f"{base}.Orientation.AngleUnit")).DisplayName.Text == "°"
                st, sr = sigmas(body, name)
                assert await _value(c, ns, f"{base}.SigmaTranslation_mm") == pytest.approx(st * 1e3)
                assert await _value(c, ns, f"{base}.SigmaRotation_deg") == pytest.approx(math.degrees(sr))
                q = await _value(c, ns, f"{base}.Quaternion")
                assert q == pytest.approx([tr["quaternion"][k] for k in "wxyz"])
                assert await _value(c, ns, f"{base}.ParentFrame") == tr["parent_frame"]
            # Writes are refused: every variable is the daemon's.
            with pytest.raises(ua.UaStatusCodeError):
                await c.get_node(ua.NodeId("Cellcal.ActiveResult.ResultId", ns)).write_value("999")
        assert await_nothing_changed(opc)

    asyncio.run(read())


def await_nothing_changed(opc: Cell) -> bool:
    active = opc.cell.svc.store.active_result()
    return active is not None and str(active.id) == opc.body["result_id"]


def test_methods_need_the_operator_role_and_run_through_the_daemon(opc):
    cell = opc.cell
    runs_before = len(cell.svc.store.list_runs(limit=100))
    drift_before = len(cell.bodies(P.TOPIC_DRIFT))

    async def refused() -> None:
        for who in (("viewer",), ()):
            async with client(opc, *who) as c:
                ns = await c.get_namespace_index(NS)
                root = c.get_node(ua.NodeId("Cellcal", ns))
                # Anonymous and observer sessions read ...
                assert await _value(c, ns, "Cellcal.ActiveResult.ResultId", until=opc.body["result_id"]) == opc.body["result_id"]
                # ... and may call neither method.
                with pytest.raises(ua.uaerrors.BadUserAccessDenied):
                    await root.call_method(ua.NodeId("Cellcal.StartRun", ns), "base_frame")
                with pytest.raises(ua.uaerrors.BadUserAccessDenied):
                    await root.call_method(ua.NodeId("Cellcal.RunDriftCheck", ns))

    asyncio.run(refused())
    assert len(cell.svc.store.list_runs(limit=100)) == runs_before and cell.svc.current_run_id() is None
    assert len(cell.bodies(P.TOPIC_DRIFT)) == drift_before

    class Changes:
        """A PLC's subscription: every data change of the node it monitors."""

        def __init__(self) -> None:
            self.values: list = []

        def datachange_notification(self, node, val, data) -> None:
            self.values.append(val)

    async def operator() -> tuple[str, int, list]:
        async with client(opc, "ops") as c:
            ns = await c.get_namespace_index(NS)
            root = c.get_node(ua.NodeId("Cellcal", ns))
            changes = Changes()
            sub = await c.create_subscription(50, changes)
            await sub.subscribe_data_change(c.get_node(ua.NodeId("Cellcal.Drift.CheckId", ns)))
            # The command's own argument checks apply: an unknown kind is refused.
            with pytest.raises(ua.uaerrors.BadInvalidArgument):
                await root.call_method(ua.NodeId("Cellcal.StartRun", ns), "warp_drive")
            result_id, check_id = await root.call_method(ua.NodeId("Cellcal.RunDriftCheck", ns))
            # The check's id arrives by the subscription, as a PLC would see it.
            deadline = asyncio.get_running_loop().time() + 30.0
            while check_id not in changes.values and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.05)
            await sub.delete()
            return result_id, check_id, changes.values

    result_id, check_id, notified = asyncio.run(operator())
    assert result_id == opc.body["result_id"] and check_id >= 1
    assert check_id in notified, notified
    drift = cell.wait_for(lambda t, b: t == P.TOPIC_DRIFT and b["check_id"] == check_id, 30.0, "the requested check")

    async def read_drift() -> None:
        async with client(opc) as c:  # anonymous reads it
            ns = await c.get_namespace_index(NS)
            await wait_async(lambda: _value(c, ns, "Cellcal.Drift.CheckId"), check_id)
            assert await _value(c, ns, "Cellcal.Drift.Status") == drift["status"] == "ok"
            assert await _value(c, ns, "Cellcal.Drift.ResultId") == result_id
            dev = await _value(c, ns, "Cellcal.Drift.DeviationTranslation_mm")
            assert dev == pytest.approx(drift["deviation_translation_m"] * 1e3)
            assert await _value(c, ns, "Cellcal.Drift.FailTranslation_mm") == pytest.approx(drift["fail_translation_m"] * 1e3)

    asyncio.run(read_drift())


async def wait_async(read, want, timeout_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    got = None
    while asyncio.get_running_loop().time() < deadline:
        got = await read()
        if got == want:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"waited for {want!r}, last read {got!r}")


def test_a_wrong_password_is_refused(opc):
    async def login() -> None:
        async with client(opc, "ops", password="not-the-password"):
            pass

    with pytest.raises(ua.UaStatusCodeError):
        asyncio.run(login())


def test_the_encrypted_endpoint_and_a_client_certificate_start_a_run(opc, caplog):
    caplog.set_level(logging.INFO, logger="cellcal.daemon.plant")
    cell = opc.cell
    assert cell.svc.wait_idle(30.0)

    async def secure() -> tuple[str, int]:
        c = Client(opc.url, timeout=20)
        await c.set_security(SecurityPolicyBasic256Sha256, certificate=str(opc.client_cert),
                             private_key=str(opc.client_key), server_certificate=str(opc.server_cert),
                             mode=ua.MessageSecurityMode.SignAndEncrypt)
        async with c:
            assert c.security_policy.Mode == ua.MessageSecurityMode.SignAndEncrypt
            ns = await c.get_namespace_index(NS)
            assert await _value(c, ns, "Cellcal.ActiveResult.ResultId", until=opc.body["result_id"]) == opc.body["result_id"]
            root = c.get_node(ua.NodeId("Cellcal", ns))
            run_id, planned = await root.call_method(ua.NodeId("Cellcal.StartRun", ns), "base_frame")
            return run_id, planned

    run_id, planned = asyncio.run(secure())
    assert planned == 6
    body = cell.wait_result(run_id)
    assert body["active"] is True
    assert cell.svc.store.get_run(int(run_id)).kind == "base_frame"
    # The command went through the same path as a ZeroMQ one, logged with the certificate's user.
    assert any("cmd start_run key=opcua:cert:plc role=operator name=plc -> ok" in r.getMessage() for r in caplog.records)


def test_a_certificate_named_on_the_none_endpoint_takes_no_role(opc, caplog):
    """A local client opens a channel without security naming plc's (public) certificate as
    its sender certificate, holding no key of plc's, and asks for no user: it is anonymous,
    an observer, and may start nothing (issue 29)."""
    caplog.set_level(logging.INFO, logger="cellcal.daemon.plant")
    cell = opc.cell
    assert cell.svc.wait_idle(30.0)
    runs_before = len(cell.svc.store.list_runs(limit=100))
    plc = x509.load_der_x509_certificate(opc.client_cert.read_bytes())
    thumb = plc.fingerprint(hashes.SHA1()).hex()

    async def claim_plc() -> str:
        c = Client(opc.url, timeout=20)
        # asyncua's own policy object for no security, given plc's certificate and no key.
        # asyncua's client writes OpenSecureChannel's sender certificate only when the
        # policy's Mode is not None_, so Mode is Sign while that message is written, and the
        # request itself asks for None_ (what the server opens the channel with): on the
        # wire, an unsigned OpenSecureChannel of security policy None naming plc.
        policy = SecurityPolicyNone(host_cert=plc, mode=ua.MessageSecurityMode.Sign)
        c.security_policy = policy
        c.uaclient.set_security(policy)
        await c.connect_socket()
        try:
            await c.send_hello()
            await c.uaclient.open_secure_channel(ua.OpenSecureChannelParameters(
                ClientProtocolVersion=0, RequestType=ua.SecurityTokenRequestType.Issue,
                SecurityMode=ua.MessageSecurityMode.None_, RequestedLifetime=c.secure_channel_timeout,
                ClientNonce=b""))
            policy.Mode = ua.MessageSecurityMode.None_  # the session, as on any channel without security
            await c.create_session()
            await c.activate_session()  # an anonymous token: no user of its own
            ns = await c.get_namespace_index(NS)
            root = c.get_node(ua.NodeId("Cellcal", ns))
            with pytest.raises(ua.uaerrors.BadUserAccessDenied):
                await root.call_method(ua.NodeId("Cellcal.StartRun", ns), "base_frame")
            with pytest.raises(ua.uaerrors.BadUserAccessDenied):
                await root.call_method(ua.NodeId("Cellcal.RunDriftCheck", ns))
            # It reads, as anonymous does (the result an earlier test activated, once applied).
            return await _value(c, ns, "Cellcal.ActiveResult.ResultId", until=active)
        finally:
            await c.disconnect()

    active = str(cell.svc.store.active_result().id)
    assert asyncio.run(claim_plc()) == active
    assert len(cell.svc.store.list_runs(limit=100)) == runs_before and cell.svc.current_run_id() is None
    # The certificate did reach the server, and was dropped there (not lost on the way).
    ignored = [r.getMessage() for r in caplog.records if "certificate named on a channel without security" in r.getMessage()]
    assert ignored and thumb in ignored[-1], ignored


def test_an_x509_user_token_on_the_none_endpoint_is_its_certificates_user(opc, caplog):
    """On the none endpoint a certificate still counts when it is proven: an X.509 user token,
    signed with plc's key over the server's certificate and nonce (asyncua checks it)."""
    caplog.set_level(logging.INFO, logger="cellcal.daemon.plant")
    cell = opc.cell
    assert cell.svc.wait_idle(30.0)

    async def as_plc() -> tuple[str, int]:
        c = Client(opc.url, timeout=20)
        await c.load_client_certificate(str(opc.client_cert))
        await c.load_private_key(opc.client_key)
        async with c:
            assert c.security_policy.Mode == ua.MessageSecurityMode.None_
            ns = await c.get_namespace_index(NS)
            return await c.get_node(ua.NodeId("Cellcal", ns)).call_method(ua.NodeId("Cellcal.RunDriftCheck", ns))

    result_id, check_id = asyncio.run(as_plc())
    assert result_id == str(cell.svc.store.active_result().id)
    assert any("cmd run_drift_check key=opcua:cert:plc role=operator name=plc -> ok" in r.getMessage()
               for r in caplog.records)
    cell.wait_for(lambda t, b: t == P.TOPIC_DRIFT and b["check_id"] == check_id, 30.0, "the requested check")


def test_without_the_none_endpoint_a_channel_without_security_does_discovery_only(secure_only, caplog):
    """A server offering sign_and_encrypt only still opens a channel of security policy None
    (discovery runs on one), but a session is refused there: a client without an application
    certificate must not read with a password sent in clear, or guess passwords, past the
    trust list (issue 29)."""
    caplog.set_level(logging.INFO, logger="cellcal.daemon.plant")
    adapter = secure_only.cell.app.plant.adapter("opcua")
    ns, url = adapter.ns, secure_only.url
    before = _sessions(secure_only)
    cell_name = ua.ReadParameters(NodesToRead=[ua.ReadValueId(NodeId=ua.NodeId("Cellcal.Cell", ns),
                                                              AttributeId=ua.AttributeIds.Value)])
    browse = ua.BrowseParameters(NodesToBrowse=[ua.BrowseDescription(
        NodeId=ua.NodeId("Cellcal", ns), BrowseDirection=ua.BrowseDirection.Forward,
        ReferenceTypeId=ua.NodeId(ua.ObjectIds.HierarchicalReferences), IncludeSubtypes=True, ResultMask=63)])

    def as_ops(password: str) -> ua.ActivateSessionParameters:
        # The password in clear, as a client on a channel without security sends it.
        params = ua.ActivateSessionParameters()
        params.UserIdentityToken = ua.UserNameIdentityToken(PolicyId="username", UserName="ops",
                                                            Password=password.encode())
        return params

    async def none_channel() -> None:
        c = Client(url, timeout=20)   # asyncua's default: security policy None, no certificate
        await c.connect_socket()
        try:
            await c.send_hello()
            await c.open_secure_channel()
            # Discovery works: the client finds the secure endpoint (the only one) and the server.
            endpoints = await c.uaclient.get_endpoints(ua.GetEndpointsParameters(EndpointUrl=url))
            assert [(e.SecurityPolicyUri, e.SecurityMode) for e in endpoints] == [
                (SecurityPolicyBasic256Sha256.URI, ua.MessageSecurityMode.SignAndEncrypt)]
            servers = await c.uaclient.find_servers(ua.FindServersParameters(EndpointUrl=url))
            assert [str(s.ApplicationUri) for s in servers] == [application_uri(adapter.port.cell)]
            with pytest.raises(ua.uaerrors.BadUserAccessDenied):  # no session yet (asyncua's rule)
                await c.uaclient.read(cell_name)
            # Sent directly, not by Client.create_session, whose own "no matching endpoint"
            # check a client may leave out.
            with pytest.raises(ua.uaerrors.BadSecurityPolicyRejected):
                await c.uaclient.create_session(ua.CreateSessionParameters(
                    EndpointUrl=url, SessionName="none channel", RequestedSessionTimeout=10000,
                    ClientNonce=b"n" * 32, ClientDescription=ua.ApplicationDescription(
                        ApplicationUri="urn:plant:no-certificate", ApplicationType=ua.ApplicationType.Client)))
            # Whatever the server kept of that session, nothing more: the right password and a
            # wrong one get the same answer (neither is checked), and nothing is read or browsed.
            for password in (PASSWORDS["ops"], "a-guess"):
                with pytest.raises(ua.uaerrors.BadSecurityPolicyRejected):
                    await c.uaclient.activate_session(as_ops(password))
            with pytest.raises(ua.uaerrors.BadSecurityPolicyRejected):
                await c.uaclient.read(cell_name)
            with pytest.raises(ua.uaerrors.BadSecurityPolicyRejected):
                await c.uaclient.browse(browse)
        finally:
            await c.disconnect()

    asyncio.run(none_channel())
    assert not [r for r in caplog.records if "refused (unknown user or wrong password)" in r.getMessage()]
    wait_until(lambda: _sessions(secure_only) == before, 30.0, f"the session count back at {before}")

    async def secure_reads() -> str:
        # The same server on its secure endpoint, for contrast: the password user reads.
        async with await _secure(secure_only, "hmi", "ops") as c:
            return await _value(c, ns, "Cellcal.Cell")

    assert asyncio.run(secure_reads()) == adapter.port.cell


def test_a_client_cannot_register_a_server_in_the_find_servers_answer(opc, secure_only, caplog):
    """RegisterServer / RegisterServer2 are a discovery server's services; asyncua answers them
    on any channel, without a session or the ruleset, and then lists the registered server in
    its FindServers answers: a client could point a PLC's discovery at a server of its own.
    Refused (BadServiceUnsupported) on a none channel, a secure channel and a discovery-only
    channel; FindServers lists this server only."""
    caplog.set_level(logging.INFO, logger="cellcal.daemon.plant")
    fake = ua.RegisteredServer(ServerUri="urn:plant:fake-cell", ProductUri="urn:plant:fake",
                               ServerNames=[ua.LocalizedText("cellcal fake-cell")], ServerType=ua.ApplicationType.Server,
                               DiscoveryUrls=["opc.tcp://127.0.0.1:1/"], IsOnline=True)

    async def register(c: Client, url: str, cell_name: str) -> None:
        with pytest.raises(ua.uaerrors.BadServiceUnsupported):
            await c.uaclient.register_server(fake)
        with pytest.raises(ua.uaerrors.BadServiceUnsupported):
            await c.uaclient.register_server2(ua.RegisterServer2Parameters(Server=fake))
        servers = await c.uaclient.find_servers(ua.FindServersParameters(EndpointUrl=url))
        assert [str(s.ApplicationUri) for s in servers] == [application_uri(cell_name)]

    async def on_a_none_channel(on: Cell) -> None:
        c = Client(on.url, timeout=20)   # no session: asyncua answers RegisterServer without one
        await c.connect_socket()
        try:
            await c.send_hello()
            await c.open_secure_channel()
            await register(c, on.url, on.cell.app.plant.adapter("opcua").port.cell)
        finally:
            await c.disconnect()

    async def on_a_secure_channel() -> None:
        async with await _secure(opc, "hmi", "ops") as c:   # an operator's session
            await register(c, opc.url, opc.cell.app.plant.adapter("opcua").port.cell)

    asyncio.run(on_a_none_channel(opc))
    asyncio.run(on_a_none_channel(secure_only))
    asyncio.run(on_a_secure_channel())
    refused = [r.getMessage() for r in caplog.records if "RegisterServer" in r.getMessage() and "refused" in r.getMessage()]
    assert len(refused) == 6 and all("urn:plant:fake-cell" in m for m in refused), refused


async def _secure(opc: Cell, name: str, user: str | None = None) -> Client:
    """A client on the SignAndEncrypt endpoint with the application certificate ``name``."""
    c = client(opc, user)
    await c.set_security(SecurityPolicyBasic256Sha256, certificate=str(opc.pki / f"{name}_cert.der"),
                         private_key=str(opc.pki / f"{name}_key.pem"), server_certificate=str(opc.server_cert),
                         mode=ua.MessageSecurityMode.SignAndEncrypt)
    return c


def _sessions(opc: Cell) -> tuple[int, int]:
    """The server's open sessions and subscriptions, as asyncua keeps them: its registry of
    external sessions (private, no public count; the standard CurrentSessionCount node is
    not maintained by asyncua) and its subscription service."""
    iserver = opc.cell.app.plant.adapter("opcua")._server.iserver
    return len(iserver._external_sessions), len(iserver.subscription_service.subscriptions)


def test_an_application_certificate_off_the_trust_list_is_refused_even_with_a_valid_password(opc, caplog):
    caplog.set_level(logging.INFO, logger="cellcal.daemon.plant")
    cell = opc.cell
    runs_before = len(cell.svc.store.list_runs(limit=100))
    stranger = x509.load_der_x509_certificate((opc.pki / "stranger_cert.der").read_bytes())
    thumb = stranger.fingerprint(hashes.SHA1()).hex()
    before = _sessions(opc)

    async def stranger_as_ops() -> None:
        async with await _secure(opc, "stranger", "ops"):
            pass

    with pytest.raises(ua.uaerrors.BadCertificateUntrusted):
        asyncio.run(stranger_as_ops())
    refusals = [r.getMessage() for r in caplog.records if "client certificate refused" in r.getMessage()]
    assert refusals and thumb in refusals[-1] and "urn:plant:stranger" in refusals[-1], refusals
    assert len(cell.svc.store.list_runs(limit=100)) == runs_before
    # The refused session does not stay behind (asyncua closes a session never activated
    # when its connection goes).
    wait_until(lambda: _sessions(opc) == before, 30.0, f"the session count back at {before}")

    async def trusted_by_the_directory() -> str:
        # hmi is in trusted_certificates_dir: its channel opens; its user is the password's.
        async with await _secure(opc, "hmi", "viewer") as c:
            assert c.security_policy.Mode == ua.MessageSecurityMode.SignAndEncrypt
            ns = await c.get_namespace_index(NS)
            with pytest.raises(ua.uaerrors.BadUserAccessDenied):  # viewer is an observer
                await c.get_node(ua.NodeId("Cellcal", ns)).call_method(ua.NodeId("Cellcal.StartRun", ns), "base_frame")
            return await _value(c, ns, "Cellcal.ActiveResult.ResultId")

    assert asyncio.run(trusted_by_the_directory()) == str(cell.svc.store.active_result().id)
    assert len(cell.svc.store.list_runs(limit=100)) == runs_before


# A PLC that subscribes and then loses power: killed, its session never closed.
_DROPPED_CLIENT = """
import asyncio, sys
from asyncua import Client, ua

async def main(url, ns_uri):
    c = Client(url, timeout=20)
    c.session_timeout = 5000  # ms: what the server keeps a silent session with subscriptions for
    await c.connect()
    ns = await c.get_namespace_index(ns_uri)
    seen = asyncio.Event()

    class Changes:
        def datachange_notification(self, node, val, data):
            seen.set()

    sub = await c.create_subscription(50, Changes())
    await sub.subscribe_data_change([c.get_node(ua.NodeId(p, ns)) for p in
                                     ("Cellcal.Drift.CheckId", "Cellcal.ActiveResult.ResultId")])
    await asyncio.wait_for(seen.wait(), 30)
    print("subscribed", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def test_a_subscriber_killed_without_closing_leaves_the_server_serving(opc):
    cell = opc.cell
    assert cell.svc.wait_idle(60.0)
    if not cell.bodies(P.TOPIC_DRIFT):
        # Drift.Time, read below, has a value once a drift check has been published; another
        # test's check does not count when this one runs alone or on another xdist worker.
        _drift_check(cell)
    before = _sessions(opc)
    proc = subprocess.Popen([sys.executable, "-c", _DROPPED_CLIENT, opc.url, NS], stdout=subprocess.PIPE, text=True)
    try:
        line = _readline(proc, 60.0)
        assert line.strip() == "subscribed", line
        assert _sessions(opc)[0] == before[0] + 1 and _sessions(opc)[1] > before[1]
    finally:
        proc.kill()  # no CloseSession, no FIN from the client's side of the protocol
        proc.wait(timeout=10)

    class Changes:
        def __init__(self) -> None:
            self.values: list = []

        def datachange_notification(self, node, val, data) -> None:
            self.values.append(val)

    async def next_client() -> tuple[object, list]:
        async with client(opc, "viewer") as c:
            ns = await c.get_namespace_index(NS)
            # The current values, while the dead client's session may still be kept.
            active = str(cell.svc.store.active_result().id)
            assert await _value(c, ns, "Cellcal.ActiveResult.ResultId") == active
            last = await _value(c, ns, "Cellcal.Drift.Time")  # set anew by every drift event
            changes = Changes()
            sub = await c.create_subscription(50, changes)
            await sub.subscribe_data_change(c.get_node(ua.NodeId("Cellcal.Drift.Time", ns)))
            # The next published event updates them.
            check_id = await asyncio.get_running_loop().run_in_executor(None, _drift_check, cell)
            deadline = asyncio.get_running_loop().time() + 30.0
            while not [v for v in changes.values if v != last] and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.05)
            await wait_async(lambda: _value(c, ns, "Cellcal.Drift.CheckId"), check_id)
            assert await _value(c, ns, "Cellcal.Drift.ResultId") == active
            await sub.delete()
            return last, changes.values

    last, notified = asyncio.run(next_client())
    assert [v for v in notified if v != last], notified
    # asyncua keeps a session that has subscriptions past the loss of its connection (OPC
    # 10000-4 6.7: a client may reconnect and take it back) until its session timeout, the
    # client's request clamped to [5 s, 600 s]; then closes it with its subscriptions.
    wait_until(lambda: _sessions(opc) == before, 60.0, f"sessions and subscriptions back at {before}")


def _drift_check(cell) -> int:
    n = len(cell.bodies(P.TOPIC_DRIFT))
    cell.svc.request_drift_check("test")
    body = cell.wait_for(lambda t, b: t == P.TOPIC_DRIFT and len(cell.bodies(P.TOPIC_DRIFT)) > n, 60.0, "a drift check")
    return int(body["check_id"])


def _readline(proc: subprocess.Popen, timeout_s: float) -> str:
    """A line of the child's output, or AssertionError after ``timeout_s`` (monotonic)."""
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        ready, _w, _x = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if ready:
            return proc.stdout.readline()
        if proc.poll() is not None:
            break
    raise AssertionError(f"no line from the client within {timeout_s} s (exit {proc.poll()})")


# ---- a cell that has not calibrated yet ------------------------------------------------------------

#: OPC UA's null DateTime: the DateTime encoded as 0 (OPC 10000-6), 1601-01-01 00:00 UTC.
NULL_TIME = datetime(1601, 1, 1, tzinfo=UTC)


@pytest.fixture
def fresh(tmp_path):
    """A cell of its own with no result and no drift check yet (the module's cell has both):
    the none endpoint on loopback, anonymous reads, no ZeroMQ."""
    port = free_port()
    section = {"enabled": True, "endpoint": f"opc.tcp://127.0.0.1:{port}", "security": ["none"],
               "allow_none_on_loopback": True, "anonymous": True, "update_s": 0.05}
    with inprocess_cell(tmp_path, n_stations=6, zmq=False, overrides={"opcua": section}) as cell:
        assert cell.svc.store.active_result() is None and not cell.bodies(P.TOPIC_DRIFT)
        yield Cell(cell, section["endpoint"], Path(), Path(), Path(), {}, Path(), section)


async def _read_everything(c: Client, ns: int) -> dict[str, object]:
    """Every variable under ``Cellcal`` (browsed, properties included) read as a PLC reads it:
    node id -> value; a variable whose read fails is the AssertionError, with all such named."""
    values: dict[str, object] = {}
    failed: list[str] = []
    todo = [c.get_node(ua.NodeId("Cellcal", ns))]
    while todo:
        node = todo.pop()
        for child in await node.get_children():
            todo.append(child)
            if await child.read_node_class() != ua.NodeClass.Variable:
                continue
            key = child.nodeid.to_string()
            try:
                values[key] = await child.read_value()
            except (ua.UaError, ua.UaStatusCodeError) as exc:
                failed.append(f"{key}: {exc!r}")
    assert not failed, failed
    return values


def test_a_cell_without_a_result_or_a_drift_check_reads_without_errors(fresh):
    """Before the first result and the first drift check every variable reads (a PLC polling
    from power-on sees values, not errors); the times are OPC UA's null DateTime, the
    numbers NaN, until the daemon has them; then they are real."""
    cell = fresh.cell

    async def read(expect_check: int | None) -> dict[str, object]:
        async with client(fresh) as c:  # anonymous, as a PLC polling from power-on may be
            ns = await c.get_namespace_index(NS)
            if expect_check is not None:  # the server applies both events after the store has them
                await wait_async(lambda: _value(c, ns, "Cellcal.ActiveResult.ResultId"),
                                 str(cell.svc.store.active_result().id))
                await wait_async(lambda: _value(c, ns, "Cellcal.Drift.CheckId"), expect_check)
            values = await _read_everything(c, ns)
            return {k.split(";s=", 1)[-1]: v for k, v in values.items()}

    before = asyncio.run(read(None))
    assert before["Cellcal.Cell"] == cell.app.plant.adapter("opcua").port.cell
    for path in ("Cellcal.ActiveResult.Created", "Cellcal.Drift.Time"):
        assert before[path] == NULL_TIME, (path, before[path])
    assert before["Cellcal.ActiveResult.ResultId"] == "" and before["Cellcal.Drift.CheckId"] == 0
    for path in ("Cellcal.ActiveResult.RmsTranslation_mm", "Cellcal.ActiveResult.SigmaTranslation_mm",
                 "Cellcal.Drift.DeviationTranslation_mm", "Cellcal.Drift.Cusum_mm"):
        assert math.isnan(before[path]), (path, before[path])
    assert not [p for p in before if ".Frames." in p or ".Points." in p]

    started = datetime.now(UTC)
    body = cell.wait_result(cell.svc.start_run("base_frame", reason="test"))
    assert cell.svc.wait_idle(20.0)
    check_id = _drift_check(cell)
    after = asyncio.run(read(check_id))
    assert after["Cellcal.ActiveResult.ResultId"] == body["result_id"]
    created = after["Cellcal.ActiveResult.Created"]
    # The result's own time (OPC UA's DateTime counts 100 ns, Python's datetime microseconds).
    assert abs((created - datetime.fromtimestamp(body["created_ns"] * 1e-9, tz=UTC)).total_seconds()) < 1e-5
    assert after["Cellcal.Drift.CheckId"] == check_id
    assert after["Cellcal.Drift.Time"] >= started.replace(microsecond=0)
    assert not math.isnan(after["Cellcal.ActiveResult.RmsTranslation_mm"])
    assert [p for p in after if p.startswith("Cellcal.ActiveResult.Frames.")]  # the frames read too
