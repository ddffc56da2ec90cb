"""cellcal's daemon: capture, state machine, store, ZeroMQ interface, systemd glue and CLI.

Where things happen
-------------------
A station's life, module by module (each module's docstring says more):

``capture``
    A station is **born** here: :class:`~cellcal.daemon.capture.CaptureEngine` waits for
    the robot to rest, measures with the tracker (a 6-DoF pose, or a reflector's 3-DoF
    point with ``[tracker] measure = "point"``: emScon and GeoCOM instruments), checks the
    windows and the data's consistency (pose vs forward kinematics, the tracker's range, a
    frozen value, the run's estimate) and returns a
    :class:`~cellcal.daemon.store.StationRecord` (or raises
    ``StationRejected`` with the reason, ``DeviceFault`` naming the device at fault). ``devices`` opens the robot and tracker it
    uses (attributing a failure to the device that raised) and holds the backoff.
``store``
    It is **stored** here, as it is: one SQLite transaction per accepted station, the
    table's columns derived from ``StationRecord``'s fields. Runs, results (versioned, with
    provenance), drift checks and activations live here too.
``solve``
    A run is **solved** here: stored stations -> ``cellcal.solver`` (point stations:
    ``calibrate_base_frame_points``) -> the record to store (``report.result_to_wire``, the
    acceptance gates of ``gates``, the check stations of ``drift``, the provenance).
``bodies`` and ``zmq_server``
    Everything is **published** as the bodies ``bodies`` builds from the TypedDicts of
    ``protocol`` (the one definition of the wire contract, also written for other languages
    in ``docs/protocols/zeromq.md``); ``zmq_server`` moves them (PUB + ROUTER, CURVE roles)
    and ``zmq_glue`` turns commands into service calls.
``service``
    The state machine that decides what happens when: its worker runs runs and drift
    checks (``drift`` judges them), its supervising loop beats the heartbeat and the
    systemd watchdog.
``app``
    Assembles store + service + ZeroMQ server and tears them down in order: ``cellcal run``
    (``cmd_run``), ``cellcal demo`` (``cmd_demo``), the test harness and the benchmarks all
    use it.

Around them: ``config`` (TOML into frozen dataclasses, SI units), ``plan`` (station plans),
``exports`` (JSON, URDF, ROS 2 files written atomically), ``sdnotify`` (systemd),
``client`` (the Python client), ``cli`` and the ``cmd_*`` modules (one per ``cellcal``
subcommand), ``stations_io`` (station files for ``cellcal solve``), ``harness`` (the
simulated cell in-process or as processes, for tests and benchmarks), and ``instruments``
(which simulated instrument serves the cell, and the ``[tracker]`` keys each needs: the
demo's, the harness's and the benchmarks' one list).

Errors are ``cellcal.solver.errors.CellcalError`` subclasses: ``ConfigError``,
``StoreError`` (and its kinds), ``CommandError`` (a protocol error code), ``ServiceError``,
``StationRejected``, ``DeviceFault``, ``DeviceOpenError``, ``PlanError`` (also a
``ValueError``), ``UsageError`` (``cellcal ctl``), ``ClientError``, ``HarnessError``.
"""
