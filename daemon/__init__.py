"""cellcal's daemon: capture, run kinds, state machine, store, interfaces, systemd glue and CLI.

Where things happen
-------------------
A station's life, module by module (each module's and package's docstring says more; ADR
0018 says why the layout is what it is):

``capture`` (with ``consistency``, ``monitor``, ``devices``)
    A station is **born** here: :class:`~cellcal.daemon.capture.CaptureEngine` waits for
    the robot to rest (``monitor``: every robot sample read in a thread), measures, checks
    the windows and the data's consistency (``consistency``: pose vs forward kinematics, the
    tracker's range, a frozen value, the run's rough estimate) and returns a
    :class:`~cellcal.daemon.store.StationRecord`, or raises ``StationRejected`` with the
    reason, ``DeviceFault`` naming the device at fault. ``devices`` opens the devices
    (attributing a failure to the device that raised).
``runs/``
    What a run **does** is its kind's: one module per kind (``base_frame``, ``points``,
    ``tool_point``, ``hand_eye``, ``kinematics``) behind the ``RunKind`` protocol, found in a
    lazy registry: its plan, capture policy, solve (``solve``: stations as the solver's
    arrays), gates (``gates``), stored record, report section, exports and resume rules.
``store/``
    It is **stored** here, as it is: one SQLite transaction per accepted station, the
    table's columns derived from ``StationRecord``'s fields. Runs, results (versioned, with
    provenance), drift checks and activations live here too.
``jobs/`` and ``service``
    The service is the state machine, the job queue and the supervising loop (heartbeat,
    systemd watchdog); its worker runs the jobs: a run (``jobs.run``: the same capture and
    solve loop for every kind), a drift check (``jobs.drift``; ``drift`` judges it), the
    store's recovery (``jobs.outage``) and the resume policy (``jobs.resume``); a result is
    stored, gated, activated, exported and published in ``jobs.results``.
``bodies``, ``wire/`` and ``zmq_glue``
    Everything is **published** as the bodies ``bodies`` builds (a result's wire form
    among them) from the TypedDicts of ``protocol`` (the one name of the wire contract,
    defined in ``wire/``, also written for other languages in ``docs/protocols/zeromq.md``);
    ``wire.zmq_server`` moves them (PUB + ROUTER, CURVE roles, ``wire.security``) and
    ``zmq_glue`` turns commands into service calls. ``plant/`` serves the same to OPC UA,
    MQTT and Prometheus.
``app``
    Assembles store + service + ZeroMQ server (+ plant interfaces) and tears them down in
    order: ``cellcal run``, ``cellcal demo``, the test harness and the benchmarks all use it.

Around them: ``config/`` (TOML into frozen dataclasses, SI units), ``report/`` (the HTML
report, the export files, summaries in words), ``cli/`` (one module per ``cellcal``
subcommand, the station files of ``cellcal solve``), ``sdnotify`` (systemd), and
``testing/`` (installed as ``cellcal.testing``: the simulated cell in-process or as
processes, and a pytest plugin, for our tests, our benchmarks and an integrator's CI).

Errors are ``cellcal.solver.errors.CellcalError`` subclasses (the tree is documented there).
"""
