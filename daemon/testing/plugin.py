"""A pytest plugin: a simulated robot cell and a cellcal daemon for your own tests.

Installed with cellcal (entry point ``pytest11``: ``cellcal = "cellcal.testing.plugin"``), so
any project with cellcal installed gets these fixtures (``docs/testing.md``):

``sim_cell``
    A simulated cell serving its devices on loopback: a robot (UR RTDE, or six CiA 402
    drives over a loopback SLCAN bridge) and a measuring instrument (the cellcal tracker
    protocol, a Leica emScon tracker or a GeoCOM total station), with the truth it hides
    (:attr:`SimCell.cell_T_base`). :class:`SimCell`.
``daemon``
    ``cellcal`` running against ``sim_cell`` with its ZeroMQ interface on loopback, and a
    subscriber that records every message it publishes: :meth:`Daemon.wait_result`,
    :meth:`Daemon.wait_for`. :class:`Daemon`.
``cellcal_client``
    ``cellcal.daemon.wire.client.Client`` connected to ``daemon`` (its command socket).

What the cell is: the ``cellcal`` marker on the test (or module, ``pytestmark``), every
argument optional::

    @pytest.mark.cellcal(scenario="realistic", instrument="emscon", robot="canopen", mode="process")

``scenario``
    ``"exact"`` (default: the demo's cell with an exact arm and tracker, time x10),
    ``"realistic"`` (the demo's imperfect arm and tracker), or a path to a scenario TOML
    (``docs/simulation.md``).
``instrument``
    ``"cellcal"`` (default), ``"emscon"``, ``"geocom"``.
``robot`` (or ``robot_transport``)
    ``"rtde"`` (default) or ``"canopen"``.
``mode``
    ``"process"`` (default: ``cellcal sim`` and ``cellcal run`` as child processes, what a
    deployed cell runs) or ``"inprocess"`` (the simulators and the daemon as threads of the
    test process: faster to start, and a test may reach into them). ``--cellcal-mode``
    on the pytest command line sets the default.
``n_stations``
    Stations in the daemon's plan (default 6).
``overrides``
    Daemon configuration keys (TOML tables as dicts) merged over the harness's.

Everything listens on 127.0.0.1, ptys and in-process buses only; every wait has a deadline.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from cellcal.daemon import protocol as P
from cellcal.daemon.app import App
from cellcal.daemon.cli.instruments import config_overrides
from cellcal.daemon.config import load_config_text
from cellcal.daemon.wire.client import Client
from cellcal.sim.scenario import load_scenario
from cellcal.testing.harness import (
    PROFILE_OVERRIDES,
    SCENARIOS,
    DaemonProcess,
    HarnessError,
    Recorder,
    SimProcess,
    daemon_config,
    profile_of,
    to_toml,
    write_config,
)
from cellcal.testing.simulators import SimulatedDevices, simulated_devices

__all__ = ["CellSettings", "SimCell", "Daemon", "sim_cell", "daemon", "cellcal_client", "MODES"]

#: How the cell runs (module docstring).
MODES = ("process", "inprocess")
_DEFAULT_TIMEOUT_S = 120.0


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cellcal", "cellcal simulated cell")
    group.addoption("--cellcal-mode", choices=MODES, default=None,
                    help="how the cellcal fixtures run the cell: child processes (default) or in this process")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cellcal(scenario, instrument, robot, mode, n_stations, overrides): "
                                       "the simulated cell of the sim_cell and daemon fixtures (cellcal.testing)")


@dataclass(frozen=True)
class CellSettings:
    """What the ``cellcal`` marker asks for (module docstring)."""

    scenario: str = "exact"
    instrument: str = "cellcal"
    robot: str = "rtde"
    mode: str = "process"
    n_stations: int = 6
    overrides: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"cellcal marker: mode must be one of {MODES}, got {self.mode!r}")
        if self.robot not in ("rtde", "canopen"):
            raise ValueError(f"cellcal marker: robot must be 'rtde' or 'canopen', got {self.robot!r}")
        if self.instrument not in ("cellcal", "emscon", "geocom"):
            raise ValueError(f"cellcal marker: instrument must be cellcal, emscon or geocom, got {self.instrument!r}")
        if self.scenario not in SCENARIOS and not Path(self.scenario).is_file():
            raise ValueError(f"cellcal marker: scenario {self.scenario!r} is neither {', '.join(SCENARIOS)} nor a file")

    @property
    def scenario_path(self) -> Path:
        return SCENARIOS[self.scenario] if self.scenario in SCENARIOS else Path(self.scenario)

    @property
    def profile(self) -> str:
        return self.scenario if self.scenario in PROFILE_OVERRIDES else profile_of(self.scenario_path)


def _settings(request: pytest.FixtureRequest) -> CellSettings:
    marker = request.node.get_closest_marker("cellcal")
    kw: dict[str, object] = dict(marker.kwargs) if marker is not None else {}
    # Indirect parametrisation (``@pytest.mark.parametrize("sim_cell", [...], indirect=True)``)
    # wins over the marker: a mapping of the marker's arguments, or a CellSettings. The daemon
    # fixture sees the sim_cell's parameter through its own request when it is the one asked.
    param = getattr(request, "param", None)
    if isinstance(param, CellSettings):
        kw.update(scenario=param.scenario, instrument=param.instrument, robot=param.robot, mode=param.mode,
                  n_stations=param.n_stations, overrides=dict(param.overrides))
    elif isinstance(param, Mapping):
        kw.update(param)
    elif param is not None:
        raise ValueError(f"cellcal: an indirect parameter must be a mapping or a CellSettings, got {param!r}")
    if "robot_transport" in kw:  # the name `cellcal sim --robot-transport` uses
        if "robot" in kw and kw["robot"] != kw["robot_transport"]:
            raise ValueError("cellcal marker: robot and robot_transport disagree")
        kw["robot"] = kw.pop("robot_transport")
    if "mode" not in kw and request.config.getoption("--cellcal-mode"):
        kw["mode"] = request.config.getoption("--cellcal-mode")
    unknown = set(kw) - {"scenario", "instrument", "robot", "mode", "n_stations", "overrides"}
    if unknown:
        raise ValueError(f"cellcal marker: unknown arguments {sorted(unknown)}")
    d = CellSettings()
    overrides = kw.get("overrides", d.overrides)
    n = kw.get("n_stations", d.n_stations)
    if not isinstance(overrides, Mapping) or not isinstance(n, int):
        raise ValueError("cellcal marker: overrides must be a mapping of TOML tables, n_stations an integer")
    return CellSettings(scenario=str(kw.get("scenario", d.scenario)), instrument=str(kw.get("instrument", d.instrument)),
                        robot=str(kw.get("robot", d.robot)), mode=str(kw.get("mode", d.mode)), n_stations=n,
                        overrides=dict(overrides))


@dataclass
class SimCell:
    """A running simulated cell.

    Attributes
    ----------
    settings : CellSettings
    urls : dict
        ``{"robot": ..., "tracker": ...}``: the device URLs a daemon's ``[robot] url`` and
        ``[tracker] url`` take.
    cell_T_base : numpy.ndarray, shape (4, 4)
        The truth: where the simulated robot base sits in the cell (the scenario's, at time 0).
    devices : SimulatedDevices or None
        In-process mode: the simulators themselves (the world, the robot, the tracker).
    """

    settings: CellSettings
    urls: dict[str, str]
    cell_T_base: npt.NDArray[np.float64]
    devices: SimulatedDevices | None = None


@dataclass
class Daemon:
    """A running cellcal daemon on loopback and a recorder of what it publishes.

    Attributes
    ----------
    cmd_endpoint, pub_endpoint : str
        Its ZeroMQ command (ROUTER) and publish (PUB) endpoints.
    config_path : Path
        The TOML it runs with.
    state_dir : Path
        Its store and exports (``exports/``).
    app : App or None
        In-process mode: the daemon itself.
    """

    cmd_endpoint: str
    pub_endpoint: str
    config_path: Path
    state_dir: Path
    recorder: Recorder
    app: App | None = None
    alive: Callable[[], bool] = lambda: True

    def client(self, timeout_s: float = 10.0) -> Client:
        """A new client of the command socket (close it, or use it as a context manager)."""
        return Client(self.cmd_endpoint, timeout_s=timeout_s, retries=3)

    def wait_for(self, topic: str, pred: Callable[[Mapping[str, object]], bool] = lambda b: True, *,
                 timeout_s: float = _DEFAULT_TIMEOUT_S) -> Mapping[str, object]:
        """The first body published on ``topic`` (``protocol.TOPIC_*``) with ``pred(body)``,
        from the daemon's start on; ``HarnessError`` (an ``AssertionError``) after ``timeout_s``."""
        for t, env in self.recorder.messages:
            if t == topic and pred(env["body"]):
                return env["body"]
        _, env = self.recorder.wait_for(lambda t, b: t == topic and pred(b), timeout_s, alive=self.alive,
                                        what=f"a {topic} message")
        return env["body"]

    def wait_result(self, run_id: int | str, *, timeout_s: float = _DEFAULT_TIMEOUT_S) -> Mapping[str, object]:
        """The result body of run ``run_id`` as published (``cellcal/v1/result``); a run that
        ends without one (failed, aborted) is a ``HarnessError`` naming how it ended."""
        want = str(run_id)

        def done(b: Mapping[str, object]) -> bool:
            return b.get("run_id") == want and not b.get("retained")

        try:
            return self.wait_for(P.TOPIC_RESULT, done, timeout_s=timeout_s)
        except HarnessError:
            states = [env["body"].get("reason") for t, env in self.recorder.messages
                      if t == P.TOPIC_STATE and env["body"].get("run_id") in (want, int(want) if want.isdigit() else None)]
            raise HarnessError(f"no result of run {run_id} within {timeout_s} s; its state messages: {states[-5:]}"
                               ) from None


def _truth(settings: CellSettings) -> npt.NDArray[np.float64]:
    return np.asarray(load_scenario(settings.scenario_path).truth.cell_T_base, dtype=float)


@contextlib.contextmanager
def start_sim_cell(settings: CellSettings, workdir: Path) -> Iterator[SimCell]:
    """The simulated cell of ``settings`` (the ``sim_cell`` fixture without pytest)."""
    workdir.mkdir(parents=True, exist_ok=True)
    if settings.mode == "inprocess":
        with simulated_devices(settings.scenario_path, instrument=settings.instrument,
                               robot_transport=settings.robot) as devices:
            yield SimCell(settings, {"robot": devices.robot.url, "tracker": devices.tracker.url},
                          _truth(settings), devices)
        return
    args = ["--instrument", settings.instrument, "--robot-transport", settings.robot]
    with SimProcess(settings.scenario_path, workdir / "sim.log", *args) as sim:
        urls = sim.start()
        yield SimCell(settings, {"robot": urls["robot"], "tracker": urls["tracker"]}, _truth(settings))


@contextlib.contextmanager
def start_daemon(cell: SimCell, workdir: Path) -> Iterator[Daemon]:
    """A daemon calibrating ``cell`` (the ``daemon`` fixture without pytest)."""
    s = cell.settings
    workdir.mkdir(parents=True, exist_ok=True)
    overrides = {**config_overrides(s.instrument), **dict(s.overrides)}
    cfgd = daemon_config(robot_url=cell.urls["robot"], tracker_url=cell.urls["tracker"], workdir=workdir,
                         n_stations=s.n_stations, overrides=overrides, profile=s.profile)
    path = write_config(workdir / "cellcal.toml", cfgd)
    cfg = load_config_text(to_toml(cfgd), source=str(path))
    recorder = Recorder(cfg.zmq.pub_endpoint)  # before the daemon binds: nothing it publishes is missed
    try:
        if s.mode == "inprocess":
            with App(cfg, supervise=True) as app:
                yield Daemon(cfg.zmq.cmd_endpoint, cfg.zmq.pub_endpoint, path, Path(cfg.service.state_dir), recorder,
                             app=app)
            return
        proc = DaemonProcess(path, workdir / "daemon.log").start()
        try:
            yield Daemon(cfg.zmq.cmd_endpoint, cfg.zmq.pub_endpoint, path, Path(cfg.service.state_dir), recorder,
                         alive=proc.alive)
        finally:
            proc.terminate()
    finally:
        recorder.close()


@pytest.fixture
def sim_cell(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SimCell]:
    """A running simulated cell (module docstring; the ``cellcal`` marker chooses it)."""
    with start_sim_cell(_settings(request), tmp_path / "sim") as cell:
        yield cell


@pytest.fixture
def daemon(sim_cell: SimCell, tmp_path: Path) -> Iterator[Daemon]:
    """cellcal running against ``sim_cell`` on loopback (module docstring)."""
    with start_daemon(sim_cell, tmp_path / "daemon") as d:
        yield d


@pytest.fixture
def cellcal_client(daemon: Daemon) -> Iterator[Client]:
    """A client of ``daemon``'s command socket."""
    with daemon.client() as c:
        yield c

