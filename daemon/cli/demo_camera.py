"""``cellcal demo --camera eye_in_hand|eye_to_hand``: the pieces of the camera demo.

The camera demo (``cellcal.daemon.cli.demo``) starts, beside the simulated robot and tracker,
the rendered camera as a GigE Vision device on a loopback address of its own
(``cellcal.sim.camera_cell.start_camera``, as the in-process test cell does) and gives the
daemon its ``[camera]`` section (``camera_section``); then it runs kind ``hand_eye``
(eye-in-hand) or ``eye_to_hand``. The tracker stays in the cell and measures at every camera
station: eye-to-hand its target on the board (``[camera.hand_eye] tracker_target_mm``, where
it sits on the board), eye-in-hand its target on the flange (``tracker_flange_target``). The
tracker check needs the robot base in the cell (and, eye-in-hand, the flange target's pose),
so the demo runs a base-frame calibration first.

This module holds what the demo adds for a camera: the ``[camera]`` overrides
(:func:`camera_overrides`), the truth of the camera chain (:func:`camera_truth`), the
errors against it (:func:`camera_truth_error`) and the text report (:func:`camera_lines`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from cellcal.daemon import runs
from cellcal.daemon.bodies import transform_from_wire
from cellcal.daemon.report.reading import as_list, as_map, to_float
from cellcal.solver.se3 import se3_inverse, so3_log

if TYPE_CHECKING:  # the simulator itself is loaded in the functions that use it only
    from cellcal.sim.scenario import Scenario

__all__ = ["CAMERA_SETUPS", "SETUP_KINDS", "DEFAULT_VIEWS", "camera_overrides", "camera_truth",
           "camera_truth_error", "camera_lines"]

#: ``--camera`` choices: how the camera is mounted (``[camera] mounting``).
CAMERA_SETUPS = ("eye_in_hand", "eye_to_hand")
#: The run kind that calibrates each setup (``protocol.RunKind``).
SETUP_KINDS = {"eye_in_hand": "hand_eye", "eye_to_hand": "eye_to_hand"}
#: ``[camera.hand_eye]`` of the demo's cell. Its arm carries the kinematic error of a
#: factory-calibrated UR (ADR 0015; up to ~0.5 mm and 0.04 deg, config/demo.toml's [drift]):
#: the camera chain's tests see it as robot corrections beyond the repeatability, and its
#: part common to every view no residual shows. Declared as the arm's accuracy, the
#: covariance covers it; the warning is accepted as the demo's base frame accepts its own
#: (a real cell decides: calibrate the arm's kinematics).
DEMO_HAND_EYE: dict[str, object] = {"robot_accuracy_mm": 0.5, "robot_accuracy_deg": 0.05, "allow_model_error": True,
                                   "max_sigma_translation_mm": 2.0, "max_sigma_rotation_deg": 0.2}
#: Camera views without ``--stations`` (the daemon's tests take 10; the held-out closure needs 6).
DEFAULT_VIEWS = 12


def camera_overrides(url: str, setup: str, scenario: Scenario, workdir: Path, *, n_views: int,
                     use_intrinsics: str) -> dict[str, object]:
    """The ``[camera]`` table (TOML keys) the demo's daemon gets for the simulated camera at
    ``url``: ``camera_section``'s, with ``use_intrinsics`` and the tracker check: eye-to-hand,
    where the tracker's target sits on the camera's board (``[camera.hand_eye]
    tracker_target_mm``, the board's frame: what an integrator reads off the fixture's
    drawing); eye-in-hand, the tracker's flange target measured at every view."""
    from cellcal.sim.camera_cell import camera_section  # lazy: the simulator (the demo only)
    from cellcal.sim.camera_device import default_camera  # lazy: the simulator (the demo only)

    section: dict[str, object] = camera_section(url, setup, scenario, workdir, n_views=n_views)
    section["use_intrinsics"] = use_intrinsics
    section["hand_eye"] = {**DEMO_HAND_EYE, "tracker_flange_target": True}
    if setup == "eye_to_hand":
        board = default_camera(scenario, setup).flange_T_target if scenario.camera is None else scenario.camera.flange_T_target
        assert board is not None  # an eye-to-hand camera's board rides on the flange
        p = se3_inverse(board) @ np.append(scenario.truth.flange_T_target[:3, 3], 1.0)
        section["hand_eye"] = {**DEMO_HAND_EYE, "tracker_target_mm": [float(v) * 1e3 for v in p[:3]]}
    return section


def camera_truth(scenario: Scenario, setup: str) -> dict[str, npt.NDArray[np.float64]]:
    """The two transforms of a camera hand-eye result as the simulator made them (4, 4), m:
    ``flange_T_camera`` and ``base_T_target`` (eye-in-hand), ``base_T_camera`` and
    ``flange_T_target`` (eye-to-hand); the primary first."""
    from cellcal.sim.camera_device import default_camera  # lazy: the simulator's truth (the demo only)

    cam = scenario.camera if scenario.camera is not None else default_camera(scenario, setup)
    base_T_cell = se3_inverse(scenario.truth.cell_T_base)
    if setup == "eye_in_hand":
        assert cam.flange_T_camera is not None and cam.cell_T_target is not None
        return {"flange_T_camera": cam.flange_T_camera, "base_T_target": base_T_cell @ cam.cell_T_target}
    assert cam.cell_T_camera is not None and cam.flange_T_target is not None
    return {"base_T_camera": base_T_cell @ cam.cell_T_camera, "flange_T_target": cam.flange_T_target}


def camera_truth_error(result: Mapping[str, object], truth: Mapping[str, npt.NDArray[np.float64]]) -> dict[str, object]:
    """Each transform's error against ``truth`` and its NEES against the result's own
    covariance (``cellcal.sim.truth.truth_error``, by name), and ``within_3_sigma``: every
    one inside its 3-sigma bound (False when one is outside, None when one has no usable
    covariance)."""
    from cellcal.sim.truth import truth_error  # lazy: the simulator's truth (the demo only)

    transforms = as_map(result["transforms"], "transforms")
    out: dict[str, object] = {}
    verdicts = []
    for name, T_true in truth.items():
        X = transform_from_wire(dict(as_map(transforms[name], f"transforms.{name}")))
        e = truth_error(result, X, T_true, name=name)
        out[name] = e
        verdicts.append(e["within_3_sigma"])
    out["within_3_sigma"] = False if False in verdicts else (None if None in verdicts else True)
    return out


def _transform_lines(name: str, wire: Mapping[str, object]) -> list[str]:
    X = transform_from_wire(dict(wire))
    t = X[:3, 3] * 1e3
    rv = np.degrees(so3_log(X[:3, :3]))
    q = as_map(wire["quaternion"], "quaternion")
    pad = " " * max(len(name), 15)
    return [f"  {name:<15} translation_mm [{t[0]:10.3f} {t[1]:10.3f} {t[2]:10.3f}]",
            f"  {pad} rotvec_deg     [{rv[0]:10.4f} {rv[1]:10.4f} {rv[2]:10.4f}]  "
            f"quat_wxyz [{q['w']:.6f} {q['x']:.6f} {q['y']:.6f} {q['z']:.6f}]"]


def camera_lines(result: Mapping[str, object], truth_err: Mapping[str, object], elapsed_s: float) -> list[str]:
    """The camera demo's text report: both transforms (the primary first, mm and deg), the
    chain's figures as ``cellcal show`` prints them (reprojection, held-out closure, OpenCV's
    cross-check, bootstrap, tests, the tracker check), the tracker check's gate, the gates and
    each transform's error against the simulator's truth with its NEES."""
    d = as_map(result.get("camera_hand_eye", {}), "camera_hand_eye")
    setup = str(d.get("setup", "?"))
    out = [f"cellcal demo: {result.get('kind')} calibration of the simulated cell's camera ({setup}, "
           f"{result.get('n_stations')} views, {elapsed_s:.1f} s)"]
    transforms = as_map(result["transforms"], "transforms")
    for name in [n for n in truth_err if n != "within_3_sigma"]:
        out += _transform_lines(name, as_map(transforms[name], f"transforms.{name}"))
    out += runs.for_body(result).show_lines(result)
    gates = as_map(result.get("gates", {}), "gates")
    checks = {str(as_map(c, "check").get("name")): as_map(c, "check") for c in as_list(gates.get("checks", []), "checks")}
    tc = checks.get("tracker_check")
    if tc is not None:
        if tc.get("applies", True) is False:
            out.append("  tracker_check gate: not applicable (the check did not run: the line above says why)")
        else:
            out.append(f"  tracker_check gate: {'passed' if tc.get('passed') else 'FAILED'} ({tc.get('message')})")
    failed = as_list(gates.get("failed", []), "gates.failed")
    out.append("  gates " + ("passed" if gates.get("passed") else "FAILED: " + "; ".join(str(f) for f in failed)))
    for name, e in truth_err.items():
        if name == "within_3_sigma":
            continue
        err = as_map(e, name)
        nees = err.get("nees")
        verdict = ("unknown (no usable covariance)" if nees is None else
                   f"NEES {to_float(nees):.2f}, 3-sigma bound {to_float(err['nees_3sigma_bound']):.2f} for 6 dof: "
                   f"{'within' if err['within_3_sigma'] else 'OUTSIDE'} 3 sigma")
        out.append(f"  {name} against the truth: {to_float(err['translation_m']) * 1e3:.4f} mm, "
                   f"{math.degrees(to_float(err['rotation_rad'])):.5f} deg; {verdict}")
    for w in as_list(result.get("warnings", []), "warnings"):
        if isinstance(w, Mapping):
            out.append(f"  warning {w.get('code')}: {w.get('message')}")
    return out
