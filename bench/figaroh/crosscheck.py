"""Cross-check of ``cellcal.solver.identify_kinematics`` against FIGAROH's geometric calibration.

Run ``make bench-figaroh`` (it builds its own environment under ``build/figaroh-venv``), or
``build/figaroh-venv/bin/python bench/figaroh/crosscheck.py [--no-write]`` from the repository
root. Never part of ``make test``: FIGAROH needs Pinocchio, which cellcal does not depend on.

The simulated cell is the one of ``bench/kinematics_bench.py``, imported from it (truth arm
generator, tracker noise, base frame, target, station planner and the order in which the
seeded generator draws the truth, the fit and the validation measurements), so a seed here
is the same arm and the same measurements as the same seed there. For each seed and for
point (3-DoF) and pose (6-DoF) measurements, the *same* measurements go to

(a) ``identify_kinematics`` (UR5e nominal, declared per-station tracker covariance), and
(b) FIGAROH 1.0.2's ``BaseCalibration`` at ``calibration_level: full_params`` (six placement
    errors per joint, reduced to an identifiable base set by its QR selection, base frame and
    marker estimated), on the arm as ``urdf_from_model(UR5E)`` writes it (FIGAROH ships no
    UR5e model matching our nominal; its UR10 example is a different arm).

Both are judged on the held-out validation stations: RMS / max position error against the
measurements (with the noise floor), and against the noise-free truth (the model error
itself, which the noise does not hide). Joint zero offsets, the one quantity named alike in
both, are listed side by side with our 1-sigma and the truth, and the angles between
consecutive joint axes, which are the same physical quantity in any parameterisation, are
compared for all three arms. Writes the ``figaroh`` section of ``bench/RESULTS.md`` unless
``--no-write``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import logging
import math
import sys
import tempfile
import time
import warnings
from importlib import metadata
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

# Pinocchio's and ndcurves' Boost.Python bindings both register one converter; the second
# registration is harmless and says so on every import.
warnings.filterwarnings("ignore", message="to-Python converter", category=RuntimeWarning)

import numpy as np  # noqa: E402
import pinocchio as pin  # noqa: E402
from figaroh.calibration.base_calibration import BaseCalibration  # noqa: E402
from figaroh.calibration.calibration_tools import calc_updated_fkm, update_joint_placement  # noqa: E402

from bench._common import git_state  # noqa: E402
from bench._results import machine_line, write_section  # noqa: E402
from bench.kinematics_bench import (  # noqa: E402
    CELL_T_BASE,
    FLANGE_T_TARGET,
    draw_case,
    identify,
)
from cellcal.solver import UR5E, identify_kinematics  # noqa: E402
from cellcal.solver.kinematic_export import urdf_from_model  # noqa: E402
from cellcal.solver.kinematics import DHParameters  # noqa: E402

SEEDS = (0, 1, 2, 3, 4)
N_STATIONS = 60
MODES = ("point", "pose")
#: The seed whose parameters are listed one by one.
DETAIL_SEED = 0
#: FIGAROH weights its residuals by one scalar per kind (it has no per-station covariance):
#: between the tracker's radial (6 um) and transverse (18 um) 1-sigma at 3-4 m, and the 6-DoF
#: probe's (0.01 deg MPE / 2). For points the scale does not change the estimate; for poses
#: only the ratio of the two does.
SIGMA_POSITION_M = 15e-6
SIGMA_ROTATION_RAD = math.radians(0.005)
JOINTS = tuple(f"joint{i + 1}" for i in range(6))
#: FIGAROH's tool frame: the flange (what a URDF of the arm ends in), or a fixed frame at a
#: CAD value of the target's position on the flange, 5 mm off the truth on each axis.
VARIANTS: dict[str, np.ndarray | None] = {
    "flange": None,
    "cad": FLANGE_T_TARGET[:3, 3] + np.array([0.005, -0.005, 0.005]),
}
VARIANT_LABEL = {"flange": "FIGAROH (tool frame: flange)", "cad": "FIGAROH (tool frame: CAD target)"}

_CONFIG = """\
robot:
  name: cellcal_arm
  properties:
    joints:
      active_joints: [{joints}]
tasks:
  calibration:
    enabled: true
    type: kinematic_calibration
    parameters:
      calibration_level: full_params
      include_non_geometric: false
      regularization_coefficient: 0.0
      outlier_threshold: 0.05
      random_seed: 0
    kinematics:
      base_frame: universe
      tool_frame: {tool}
    measurements:
      markers:
        - name: target
          reference_joint: joint6
          measurable_dof: [{dof}]
    data:
      source_file: {data}
      number_of_samples: {n}
"""


class _TrackerCalibration(BaseCalibration):
    """FIGAROH's calibration with our residuals: the world-frame position error (and, for
    poses, the SE(3) log-map rotation error), each divided by the tracker's scalar 1-sigma."""

    def cost_function(self, var: np.ndarray) -> np.ndarray:
        est = calc_updated_fkm(self.model, self.data, var, self.q_measured, self.calib_config)
        if self.calib_config["calibration_index"] == 3:
            return (est - self.PEE_measured) / SIGMA_POSITION_M
        raw = self._compute_logmap_residuals(self.PEE_measured, est, position_frame="world")
        return self.apply_measurement_weighting(raw, pos_weight=1.0 / SIGMA_POSITION_M,
                                                orient_weight=1.0 / SIGMA_ROTATION_RAD)


def _rows(T: np.ndarray, pose: bool) -> np.ndarray:
    """(N, 3) points or (N, 6) x y z roll pitch yaw: FIGAROH's measurement columns."""
    if not pose:
        return T[:, :3, 3]
    return np.array([np.concatenate([t[:3, 3], pin.rpy.matrixToRpy(t[:3, :3])]) for t in T])


def figaroh_fit(q: np.ndarray, T: np.ndarray, pose: bool, workdir: Path,
                tool_offset_m: np.ndarray | None = None) -> _TrackerCalibration:
    """FIGAROH's full_params calibration of the nominal URDF from stations ``q`` (N, 6) and
    measured target poses ``T`` (N, 4, 4), of which only the position is used unless ``pose``.

    The tool frame is the flange, or with ``tool_offset_m`` (3,) a fixed ``target`` frame that
    far from the flange (a CAD value of the target's position; FIGAROH still fits the marker
    offset from there)."""
    urdf = workdir / "arm.urdf"
    text = urdf_from_model(UR5E)
    tool = "flange"
    if tool_offset_m is not None:
        tool = "target"
        xyz = " ".join(repr(float(v)) for v in tool_offset_m)
        text = text.replace("</robot>", '  <link name="target"/>\n  <joint name="target_joint" type="fixed">\n'
                            '    <parent link="flange"/>\n    <child link="target"/>\n'
                            f'    <origin xyz="{xyz}" rpy="0 0 0"/>\n  </joint>\n</robot>')
    urdf.write_text(text)
    data = workdir / "fit.csv"
    cols = ["x1", "y1", "z1"] + (["phix1", "phiy1", "phiz1"] if pose else [])
    with open(data, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols + list(JOINTS))
        for qq, mm in zip(q, _rows(T, pose), strict=True):
            w.writerow([repr(float(v)) for v in (*mm, *qq)])
    cfg = workdir / "calibration.yaml"
    cfg.write_text(_CONFIG.format(joints=", ".join(JOINTS), data=data, n=len(q), tool=tool,
                                  dof=", ".join(["true"] * 3 + ["true" if pose else "false"] * 3)))
    robot = pin.RobotWrapper.BuildFromURDF(str(urdf))
    cal = _TrackerCalibration(robot, str(cfg))
    # 1.0.2's unified config has no key for these and create_param_list needs them (KeyError
    # 'known_baseframe' without); only False adds the base frame and marker to the unknowns.
    cal.calib_config["known_baseframe"] = False
    cal.calib_config["known_tipframe"] = False
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal.initialize()
        cal.solve(enable_logging=False)
    return cal


def figaroh_predict(cal: _TrackerCalibration, q: np.ndarray) -> np.ndarray:
    """Predicted target positions (N, 3) at stations ``q`` from FIGAROH's fitted model."""
    cfg = dict(cal.calib_config, NbSample=len(q))
    flat = calc_updated_fkm(cal.model, cal.data, cal.var_, q, cfg)
    return flat.reshape(cfg["calibration_index"], len(q)).T[:, :3]


def figaroh_poses(cal: _TrackerCalibration, q: np.ndarray) -> np.ndarray:
    """Marker poses (N, 4, 4) of FIGAROH's fitted model at ``q`` (for point measurements the
    marker frame keeps the tool frame's orientation: FIGAROH fits only its position then)."""
    cfg = dict(cal.calib_config, NbSample=len(q), measurability=[True] * 6, calibration_index=6)
    rows = calc_updated_fkm(cal.model, cal.data, cal.var_, q, cfg).reshape(6, len(q)).T
    T = np.tile(np.eye(4), (len(q), 1, 1))
    T[:, :3, 3] = rows[:, :3]
    T[:, :3, :3] = [pin.rpy.rpyToMatrix(r) for r in rows[:, 3:]]
    return T


def as_dh(q: np.ndarray, T: np.ndarray):
    """Any arm's FK (target poses ``T`` (N, 4, 4) at ``q``), re-expressed in our DH + Hayati
    parameters by a noise-free identification: the parameters FK-equivalent to it, so that
    FIGAROH's placement errors and the truth's DH errors compare with ours one by one."""
    cov = np.broadcast_to(np.diag([1e-12] * 3 + [1e-12] * 3), (len(q), 6, 6))
    return identify_kinematics(q, UR5E, cell_T_target=T, cell_T_target_cov=cov)


def ours_predict(res, q: np.ndarray) -> np.ndarray:
    """Predicted target positions (N, 3) from an ``identify_kinematics`` result."""
    T = res.cell_T_base @ res.model.forward(q)
    p = res.flange_p_target if res.flange_p_target is not None else res.flange_T_target[:3, 3]
    return np.einsum("nij,j->ni", T[:, :3, :3], p) + T[:, :3, 3]


def _rms_max(err: np.ndarray) -> tuple[float, float]:
    d = np.linalg.norm(err, axis=1)
    return float(np.sqrt(np.mean(d ** 2))), float(np.max(d))


def axes_dh(m: DHParameters) -> list[tuple[np.ndarray, np.ndarray]]:
    """Joint axes (point, unit direction) at q = 0 in the model's base frame."""
    L = m.link_transforms(np.zeros(6))[0]
    F = np.eye(4)
    out = []
    for i in range(6):
        out.append((F[:3, 3].copy(), F[:3, 2].copy()))
        F = F @ L[i]
    return out


def axes_figaroh(cal: _TrackerCalibration) -> list[tuple[np.ndarray, np.ndarray]]:
    """Joint axes at q = 0 of FIGAROH's fitted model (its joint parameters applied to a copy)."""
    model = cal.model.copy()
    values = dict(zip(cal.calib_config["param_name"], cal.var_, strict=True))
    tpl = ("d_px", "d_py", "d_pz", "d_phix", "d_phiy", "d_phiz")
    for j_id in cal.calib_config["actJoint_idx"]:
        name = model.names[j_id]
        xyz_rpy = np.array([values.get(f"{t}_{name}", 0.0) for t in tpl])
        update_joint_placement(model, j_id, xyz_rpy)
    data = model.createData()
    pin.forwardKinematics(model, data, np.zeros(model.nq))
    return [(data.oMi[j].translation.copy(), data.oMi[j].rotation[:, 2].copy())
            for j in cal.calib_config["actJoint_idx"]]


def axis_angles(axes: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Angles between consecutive joint axes (5,), rad: independent of base frame and
    parameterisation."""
    out = []
    for (_, u), (_, v) in zip(axes[:-1], axes[1:], strict=True):
        out.append(math.atan2(float(np.linalg.norm(np.cross(u, v))), float(u @ v)))
    return np.array(out)


def run(seed: int, mode: str, workdir: Path) -> dict:
    """One arm, one measurement kind: the data as ``bench/kinematics_bench.py`` draws it."""
    pose = mode == "pose"
    truth, plan, Tm, C, Vm, ve = draw_case(seed, N_STATIONS, mode)
    vq = plan.validation_q
    t0 = time.perf_counter()
    res = identify(plan, Tm, C, Vm, mode)
    t_ours = time.perf_counter() - t0
    # The same fit with FIGAROH's weighting (one scalar sigma per kind instead of each station's
    # covariance): separates what the weighting does from what the solver does.
    iso = np.diag([SIGMA_POSITION_M ** 2] * 3 + [SIGMA_ROTATION_RAD ** 2] * 3)
    if pose:
        res_iso = identify_kinematics(plan.q, UR5E, cell_T_target=Tm, cell_T_target_cov=np.broadcast_to(iso, C.shape))
    else:
        res_iso = identify_kinematics(plan.q, UR5E, cell_p_target=Tm[:, :3, 3],
                                      cell_p_target_cov=np.broadcast_to(iso[:3, :3], (len(Tm), 3, 3)))
    cals, t_fig = {}, []
    for variant, offset in VARIANTS.items():
        t0 = time.perf_counter()
        (workdir / variant).mkdir(parents=True, exist_ok=True)
        cals[variant] = figaroh_fit(plan.q, Tm, pose, workdir / variant, offset)
        t_fig.append(time.perf_counter() - t0)
    true_p = (CELL_T_BASE @ truth.forward(vq) @ FLANGE_T_TARGET)[:, :3, 3]
    meas_p = Vm[:, :3, 3]
    p_ours, p_iso = ours_predict(res, vq), ours_predict(res_iso, vq)
    r = dict(truth=truth, res=res, cals=cals, t_ours=t_ours, t_fig=float(np.mean(t_fig)),
             floor=math.sqrt(float(np.mean(np.sum(ve[:, :3] ** 2, axis=1)))),
             before=(res.validation.before.rms_translation_m, res.validation.before.max_translation_m),
             ours=_rms_max(p_ours - meas_p), ours_truth=_rms_max(p_ours - true_p),
             iso_truth=_rms_max(p_iso - true_p),
             n_ours=len(res.estimated) + (12 if pose else 9))
    q_all = np.concatenate([plan.q, vq])
    r["truth_dh"] = as_dh(q_all, CELL_T_BASE @ truth.forward(q_all) @ FLANGE_T_TARGET)
    for variant, cal in cals.items():
        p_fig = figaroh_predict(cal, vq)
        r[variant + "_dh"] = as_dh(q_all, figaroh_poses(cal, q_all))
        r[variant] = dict(meas=_rms_max(p_fig - meas_p), truth=_rms_max(p_fig - true_p),
                          ours=_rms_max(p_ours - p_fig), iso=_rms_max(p_iso - p_fig), n=len(cal.calib_config["param_name"]),
                          status=cal.STATUS)
    return r


def _z(res, ref, names) -> np.ndarray:
    """(estimate - reference) / our 1-sigma, per parameter name."""
    return np.array([(ref.parameters[n] - res.parameters[n]) / res.sigmas[n] for n in names])


def _zero_table(r: dict) -> list[str]:
    res, truth = r["res"], r["truth"]
    mdeg = 1e3 * 180.0 / math.pi
    lines = ["| joint | truth (as drawn) | truth in our parameters | cellcal ± 1-sigma | (cellcal - truth) / sigma | "
             "FIGAROH flange, in our parameters | FIGAROH CAD, in our parameters | FIGAROH CAD: its own lifted "
             "`d_phiz` ± std (in its fitted set?) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    lifted = r["cals"]["cad"].redistribute_parameters()
    for i in range(6):
        name = f"joint{i + 1}.zero_offset"
        key = f"d_phiz_joint{i + 1}"
        lv = lifted.get(key, {"value": math.nan, "std_dev": math.nan})
        fitted = "yes" if key in r["cals"]["cad"].calib_config["param_name"] else "no"
        own = f"{lv['value'] * mdeg:.2f} ± {lv['std_dev'] * mdeg:.2f} ({fitted})"
        if name not in res.estimated:
            lines.append(f"| {i + 1} | {truth.theta[i] * mdeg:.2f} | fixed: "
                         f"{res.unidentifiable_reasons.get(name, 'not estimated')} | | | | | {own} |")
            continue
        t = r["truth_dh"].parameters[name]
        lines.append(f"| {i + 1} | {truth.theta[i] * mdeg:.2f} | {t * mdeg:.2f} | {res.parameters[name] * mdeg:.2f} ± "
                     f"{res.sigmas[name] * mdeg:.2f} | {(res.parameters[name] - t) / res.sigmas[name]:+.1f} | "
                     f"{r['flange_dh'].parameters[name] * mdeg:.2f} | {r['cad_dh'].parameters[name] * mdeg:.2f} | "
                     f"{own} |")
    z = -_z(res, r["truth_dh"], res.estimated)
    rex = max(r[k].rms_translation_m for k in ("truth_dh", "flange_dh", "cad_dh"))
    worst = int(np.argmax(np.abs(z)))
    lines += ["", f"All {len(z)} estimated parameters against the truth in our parameters: RMS z = "
              f"{math.sqrt(float(np.mean(np.square(z)))):.2f}, largest |z| = {abs(z[worst]):.1f} "
              f"({res.estimated[worst]}). The re-expressions are exact: RMS residual of the noise-free fits over "
              f"the {r['truth_dh'].n_stations} stations {rex:.1e}"
              " m at most."]
    return lines


def _axes_table(r: dict) -> list[str]:
    nominal = axis_angles(axes_dh(UR5E))
    truth = axis_angles(axes_dh(r["truth"]))
    rows = {"cellcal": axis_angles(axes_dh(r["res"].model))}
    rows.update({VARIANT_LABEL[v]: axis_angles(axes_figaroh(r["cals"][v])) for v in VARIANTS})
    mdeg = 1e3 * 180.0 / math.pi
    lines = ["| axes | nominal (deg) | truth - nominal | " + " | ".join(f"{k} - truth" for k in rows) + " |",
             "|---|---:|---:|" + "---:|" * len(rows)]
    for k in range(5):
        lines.append(f"| {k + 1}-{k + 2} | {math.degrees(nominal[k]):.1f} | {(truth[k] - nominal[k]) * mdeg:.2f} | "
                     + " | ".join(f"{(v[k] - truth[k]) * mdeg:.3f}" for v in rows.values()) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-write", action="store_true", help="print the section, do not write bench/RESULTS.md")
    ap.add_argument("--seeds", type=int, default=len(SEEDS), help="number of seeded arms (default %(default)s)")
    args = ap.parse_args(argv)
    logging.getLogger("figaroh").setLevel(logging.ERROR)
    seeds = tuple(range(args.seeds))
    t_start = time.perf_counter()
    out: dict[tuple[str, int], dict] = {}
    with tempfile.TemporaryDirectory(prefix="cellcal-figaroh-") as tmp:
        for mode in MODES:
            for seed in seeds:
                wd = Path(tmp) / f"{mode}-{seed}"
                wd.mkdir()
                r = out[(mode, seed)] = run(seed, mode, wd)
                print(f"{mode} seed {seed}: RMS vs truth, mm: ours {r['ours_truth'][0] * 1e3:.4f}, FIGAROH flange "
                      f"{r['flange']['truth'][0] * 1e3:.4f}, CAD {r['cad']['truth'][0] * 1e3:.4f}", flush=True)
    mm = 1e3
    summary: dict[str, dict] = {}
    vers = ", ".join(f"{p} {metadata.version(p)}" for p in ("figaroh", "pin", "numpy", "scipy"))
    lines = ["## FIGAROH cross-check (`bench/figaroh/crosscheck.py`)", "", machine_line(),
             f"cellcal: {git_state()}. {vers}. Seeds {', '.join(map(str, seeds))} (arm and noise as in "
             f"`bench/kinematics_bench.py`, planner seed 1000 + seed), N = {N_STATIONS} fit stations, 30 held-out; "
             f"whole run {time.perf_counter() - t_start:.0f} s.", "",
             "**How to read.** The same simulated measurements of the same hidden-error UR5e go to "
             "`identify_kinematics` (DH + Hayati, per-station tracker covariance) and to FIGAROH's `BaseCalibration` "
             "(`full_params`: six placement errors per joint reduced by its QR selection to a base set, base frame "
             "and marker free, residuals divided by one scalar sigma per kind: "
             f"{SIGMA_POSITION_M * 1e6:.0f} um, {math.degrees(SIGMA_ROTATION_RAD) * 1e3:.0f} mdeg) on the arm as "
             "`urdf_from_model(UR5E)` writes it. *vs meas.*: held-out position error against the measurements "
             "(the floor is the RMS of the noise itself there); *vs truth*: the same predictions against the "
             "noise-free truth (the model error itself); *ours - FIGAROH*: the two predictions against each "
             "other. RMS / max in mm.", ""]
    def pair(x: tuple[float, float], digits: int = 4) -> str:
        return f"{x[0] * mm:.{digits}f} / {x[1] * mm:.{digits}f}"

    for mode in MODES:
        lines += [f"### {mode.capitalize()} measurements", "",
                  "| seed | unknowns: ours / FIGAROH flange / CAD | before (nominal) | floor | ours vs meas. | "
                  "FIGAROH flange vs meas. | FIGAROH CAD vs meas. | ours vs truth | FIGAROH flange vs truth | "
                  "FIGAROH CAD vs truth | ours, FIGAROH's weighting, vs truth | ours - FIGAROH CAD | "
                  "ours with FIGAROH's weighting - FIGAROH CAD |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for seed in seeds:
            r = out[(mode, seed)]
            fl, cad = r["flange"], r["cad"]
            lines.append(f"| {seed} | {r['n_ours']} / {fl['n']} / {cad['n']} | {pair(r['before'], 3)} | "
                         f"{r['floor'] * mm:.4f} | {pair(r['ours'])} | {pair(fl['meas'])} | {pair(cad['meas'])} | "
                         f"{pair(r['ours_truth'])} | {pair(fl['truth'])} | {pair(cad['truth'])} | {pair(r['iso_truth'])} | "
                         f"{pair(cad['ours'])} | {cad['iso'][0] * 1e9:.2f} / {cad['iso'][1] * 1e9:.2f} nm |")
        med = {k: float(np.median([out[(mode, s)][k][0] if isinstance(k, str) else
                                   out[(mode, s)][k[0]][k[1]][0] for s in seeds]))
               for k in ("ours", "ours_truth", "iso_truth", ("flange", "meas"), ("flange", "truth"), ("cad", "meas"),
                         ("cad", "truth"))}
        summary[mode] = med
        zt = [-_z(out[(mode, s)]["res"], out[(mode, s)]["truth_dh"], out[(mode, s)]["res"].estimated) for s in seeds]
        zf = [_z(out[(mode, s)]["res"], out[(mode, s)]["cad_dh"], out[(mode, s)]["res"].estimated) for s in seeds]
        med["z_truth"] = [float(np.sqrt(np.mean(z ** 2))) for z in zt]
        med["z_fig_max"] = max(float(np.max(np.abs(z))) for z in zf)
        med["iso_nm"] = max(out[(mode, s)]["cad"]["iso"][1] for s in seeds) * 1e9
        med["n"] = {k: "/".join(str(v) for v in sorted({out[(mode, s)][k]["n"] if k in VARIANTS
                                                          else out[(mode, s)]["n_ours"] for s in seeds}))
                    for k in ("ours", "flange", "cad")}
        status = sorted({out[(mode, s)][v]["status"] for s in seeds for v in VARIANTS})
        lines += ["", f"Median RMS vs truth: ours {med['ours_truth'] * mm:.4f}, FIGAROH flange "
                  f"{med[('flange', 'truth')] * mm:.4f}, FIGAROH CAD {med[('cad', 'truth')] * mm:.4f}, ours with "
                  f"FIGAROH's weighting {med['iso_truth'] * mm:.4f} mm. RMS over our "
                  f"{len(out[(mode, seeds[0])]['res'].estimated)} "
                  "estimated parameters of (cellcal - truth in our parameters) / sigma, per seed: "
                  f"{', '.join(f'{z:.2f}' for z in med['z_truth'])}; largest |FIGAROH CAD in our parameters - cellcal| / "
                  f"sigma over all seeds and parameters: {med['z_fig_max']:.1f}. "
                  f"FIGAROH status: {', '.join(status)}. Wall time per fit (median, at the load stated above): ours "
                  f"{np.median([out[(mode, s)]['t_ours'] for s in seeds]) * 1e3:.0f} ms, FIGAROH "
                  f"{np.median([out[(mode, s)]['t_fig'] for s in seeds]) * 1e3:.0f} ms.", ""]
        d = out[(mode, DETAIL_SEED)]
        lines += [f"Joint zero offsets, {mode} measurements, seed {DETAIL_SEED} (mdeg):", ""] + _zero_table(d) + [""]
        lines += [f"Angles between consecutive joint axes, {mode} measurements, seed {DETAIL_SEED} (mdeg; the same "
                  "physical quantity in any parameterisation):", ""] + _axes_table(d) + [""]
    pt, po = summary["point"], summary["pose"]
    lines += ["### Reading", "",
              "**The two solvers agree; the differences are a selection step and the weighting, both shown.** "
              "Given the same weighting (one scalar sigma per kind), cellcal and FIGAROH with its tool frame at the "
              "target return the same fitted arm: their held-out predictions differ by at most "
              f"{max(pt['iso_nm'], po['iso_nm']):.2f} nm, for point and pose measurements alike, although one "
              "fits DH + Hayati rows and the other six placement errors per joint reduced by QR. (1) With the "
              "flange as tool frame (what a URDF of the arm ends in) and point measurements, FIGAROH estimates "
              f"{pt['n']['flange']} unknowns against our {pt['n']['ours']}: its structural selection "
              "(`calculate_base_kinematics_regressor`, then `eliminate_absorbed_parameters`) judges "
              "identifiability on the position of the tool frame's origin, where a tilt of joint 6's axis moves "
              "nothing, so it fixes the angle between axes 5 and 6 at nominal (the axis table: its error is the "
              "truth's whole deviation) although the target, 85 mm off the flange, sees it. Its median model error "
              f"(vs truth) is {pt[('flange', 'truth')] * mm:.4f} mm against our {pt['ours_truth'] * mm:.4f} mm; a "
              "tool frame at a CAD value of the target (5 mm off the truth) restores the parameters "
              f"({pt['n']['cad']} unknowns) and {pt[('cad', 'truth')] * mm:.4f} mm. Pose measurements see the "
              "flange's orientation and are not affected. (2) cellcal whitens each station by the tracker's "
              "covariance (its transverse error is about 3 times its radial one at 3-4 m); FIGAROH has no "
              "per-station covariance. That is the remaining gap: our fit with FIGAROH's weighting has FIGAROH's "
              f"model error exactly ({pt['iso_truth'] * mm:.4f} / {po['iso_truth'] * mm:.4f} mm point / pose, "
              f"against {pt['ours_truth'] * mm:.4f} / {po['ours_truth'] * mm:.4f} with the covariance). **Zero "
              "offsets:** FIGAROH's own per-joint `d_phiz` (`redistribute_parameters`, what it exports) are not DH "
              "zero offsets: with six errors per placement a joint's zero is redundant with the next placement's "
              "rotation, the QR keeps few `d_phiz` in its set, and the lift is a prior-weighted minimum-norm "
              "representative, several of its sigmas off the truth's zeros. Expressed in our parameters through its "
              "FK (a noise-free identification of its fitted arm), FIGAROH's zeros match ours within the noise "
              f"(largest difference {max(pt['z_fig_max'], po['z_fig_max']):.1f} of our sigmas over every seed and "
              "parameter), and ours scatter about the truth expressed the same way as their sigmas say (RMS z "
              "near 1, listed per seed above).", ""]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_section("figaroh", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
