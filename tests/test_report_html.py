"""The HTML report (``cellcal.daemon.report.html``): its structure for every result kind,
deterministic bytes, and what headless Chromium draws of it.

Golden structure, not golden bytes: the document must parse as XML, carry every section and
figure in order, a figure that does not apply must say why, and the same inputs must give
the same bytes. The render test opens the file in headless Chromium (the Debian package
``make os-deps`` installs) and checks the screenshot is not blank and shows each figure's
colours. A ``kinematics`` result (identified on a simulated arm, wired by the daemon) adds
its "Kinematic identification" section.
"""

from __future__ import annotations

import copy
import dataclasses
import shutil
import struct
import subprocess
import xml.etree.ElementTree as ET
import zlib
from pathlib import Path

import numpy as np
import pytest
from _report_kinds import KINDS, drift_history, every_kind, kinematics_kind
from storetest_support import make_station

from cellcal.daemon.report import html as R
from cellcal.daemon.runs import kinematics_report as KR
from cellcal.daemon.store import Store
from cellcal.solver import UR5E

XHTML = "{http://www.w3.org/1999/xhtml}"
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def kinds():
    return every_kind()


def _parse(text: str) -> ET.Element:
    return ET.fromstring(text.encode("utf-8"))


def _ids(root: ET.Element, tag: str) -> list[str]:
    return [e.get("id", "") for e in root.iter(XHTML + tag) if e.get("id")]


def _figure(root: ET.Element, fig_id: str) -> ET.Element:
    (fig,) = [f for f in root.iter(XHTML + "figure") if f.get("id") == fig_id]
    return fig


def _classes(el: ET.Element) -> list[str]:
    return [e.get("class", "") for e in el.iter()]


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_has_every_section_and_figure_in_order(kinds, kind):
    body, stations = kinds[kind]
    root = _parse(R.render_report(body, stations=stations, drift_checks=drift_history()))
    assert root.tag == XHTML + "html"
    assert _ids(root, "section") == list(R.SECTIONS)
    assert _ids(root, "figure") == list(R.FIGURES)
    # with stations and drift checks, every figure applies to every kind: each draws an SVG
    for fig_id in R.FIGURES:
        fig = _figure(root, fig_id)
        assert "not-applicable" not in fig.get("class", ""), (kind, fig_id)
        assert fig.find(SVG + "svg") is not None, (kind, fig_id)
    # residual vectors: two views, one line per station in each, the magnification printed
    res = _figure(root, "fig-residuals")
    assert _classes(res).count("residual") == 2 * len(stations)
    assert "magnified x" in ET.tostring(res, encoding="unicode")
    assert "held-out" in _classes(res)  # the stations whose held-out closure is above P90
    # the error distribution: fit and held-out curves, and the P50/P90/max table
    dist = ET.tostring(_figure(root, "fig-distribution"), encoding="unicode") + ET.tostring(root, encoding="unicode")
    assert "cdf-fit" in dist and "cdf-held-out" in dist
    table = [t for t in root.iter(XHTML + "table") if t.get("class") == "distribution"][0]
    cells = ["".join(td.itertext()) for td in table.iter(XHTML + "td")]
    assert cells[0] == "fit" and cells[4] == "held-out"
    assert all(c != "n/a" for c in cells[1:4] + cells[5:8]), cells
    ell = _classes(_figure(root, "fig-ellipses"))
    assert ell.count("sigma1") == ell.count("sigma2") > 0
    assert "sigma-bar" in _classes(_figure(root, "fig-observability"))
    drift = _classes(_figure(root, "fig-drift"))
    assert {"band-warn", "band-fail", "deviation", "cusum", "cusum-h"} <= set(drift)


@pytest.mark.parametrize("kind", KINDS)
def test_without_stations_or_drift_checks_the_figures_say_why(kinds, kind):
    body, _ = kinds[kind]
    root = _parse(R.render_report(body))
    assert _ids(root, "figure") == list(R.FIGURES)
    for fig_id in ("fig-residuals", "fig-drift"):
        fig = _figure(root, fig_id)
        assert "not-applicable" in fig.get("class", "")
        assert "Not shown: " in "".join(fig.itertext())
    # what the result itself carries is still drawn
    assert _figure(root, "fig-distribution").find(SVG + "svg") is not None
    assert _figure(root, "fig-observability").find(SVG + "svg") is not None


def test_summary_names_frames_direction_units_and_quaternion_order(kinds):
    body, stations = kinds["base_frame"]
    root = _parse(R.render_report(body, stations=stations))
    summary = [s for s in root.iter(XHTML + "section") if s.get("id") == "summary"][0]
    text = " ".join("".join(summary.itertext()).split())
    assert "maps coordinates in frame b to coordinates in frame a" in text
    assert "millimetres" in text and "degrees" in text and "w, x, y, z" in text
    assert "cell_T_base" in text and "The pose of frame base in frame cell" in text
    assert "translation x y z [mm]" in text and "rotation vector x y z [deg]" in text
    (pre,) = [p for p in summary.iter(XHTML + "pre") if p.get("class") == "matrix"][:1]
    m = np.array([[float(v) for v in row.split()] for row in (pre.text or "").strip().splitlines()])
    X = np.array(body["transforms"]["cell_T_base"]["matrix"]).reshape(4, 4)
    np.testing.assert_allclose(m, X, atol=1e-9)
    t_mm = X[:3, 3] * 1e3
    assert f"{t_mm[0]:.3f}" in text


def test_gates_and_warnings_in_words(kinds):
    body, stations = copy.deepcopy(kinds["base_frame"])
    body["gates"] = {"passed": False, "failed": ["rms translation 0.612 mm > 0.500 mm"],
                     "checks": [{"name": "rms_translation", "value": 6.12e-4, "limit": 5e-4, "unit": "m",
                                 "passed": False, "message": "rms translation 0.612 mm > 0.500 mm"},
                                {"name": "rms_rotation", "value": None, "limit": 0.0017, "unit": "rad",
                                 "passed": True, "applies": False, "message": "does not apply: points"}]}
    body["warnings"] = [{"code": "model_error", "message": "residuals follow the robot pose", "value": 0.26}]
    root = _parse(R.render_report(body, stations=stations))
    gates = "".join([s for s in root.iter(XHTML + "section") if s.get("id") == "gates"][0].itertext())
    assert "Gates FAILED" in gates and "rms translation 0.612 mm > 0.500 mm" in gates
    assert "does not apply" in gates
    warns = "".join([s for s in root.iter(XHTML + "section") if s.get("id") == "warnings"][0].itertext())
    assert "model_error" in warns and "residuals follow the robot pose" in warns


def test_provenance(kinds):
    body, stations = kinds["base_frame"]
    root = _parse(R.render_report(body, stations=stations))
    prov = "".join([s for s in root.iter(XHTML + "section") if s.get("id") == "provenance"][0].itertext())
    for want in ("ab" * 32, "0.test", "20235500042", "T-1", "parent result", "2026-01-01T00:00:00+00:00"):
        assert want in prov, want


def test_same_inputs_same_bytes_and_nothing_fetched(kinds):
    body, stations = kinds["base_frame"]
    a = R.render_report(body, stations=stations, drift_checks=drift_history())
    b = R.render_report(copy.deepcopy(body), stations=copy.deepcopy(stations),
                        drift_checks=list(reversed(drift_history())))
    assert a == b
    low = a.lower()
    assert "<script" not in low and "javascript:" not in low and "@import" not in low
    assert "src=" not in low and "href=" not in low and "url(" not in low
    assert "http" not in low.replace("http://www.w3.org/1999/xhtml", "").replace("http://www.w3.org/2000/svg", "")


def test_residual_vectors_are_measured_minus_predicted(kinds):
    """A station moved by 1 mm along x shows a residual of +1 mm along x (and the others unchanged)."""
    body, stations = kinds["base_frame"]
    frame, P0, R0 = R.residual_vectors(body, stations)
    moved = copy.deepcopy(stations)
    moved[2]["cell_T_target"] = moved[2]["cell_T_target"].copy()
    moved[2]["cell_T_target"][0, 3] += 1e-3
    _, _, R1 = R.residual_vectors(body, moved)
    assert frame == "cell" and P0.shape == R0.shape == (len(stations), 3)
    np.testing.assert_allclose(R1[2] - R0[2], [1e-3, 0, 0], atol=1e-12)
    np.testing.assert_allclose(np.delete(R1, 2, 0), np.delete(R0, 2, 0), atol=0)
    # and the fit's own residual norms are what the result reports (base frame: target position)
    np.testing.assert_allclose(np.linalg.norm(R0, axis=1), body["residuals"]["translation_m"], rtol=1e-6, atol=1e-9)


def test_write_report_is_next_to_the_exports(tmp_path, kinds):
    body, stations = kinds["tool_point"]
    p = R.write_report(tmp_path / "exports", 7, R.render_report(body, stations=stations))
    assert p == tmp_path / "exports" / "result_7_report.html" == R.report_path(tmp_path / "exports", 7)
    _parse(p.read_text(encoding="utf-8"))


# --------------------------------------------------------------------------------------
# headless Chromium


def _chromium() -> str:
    for name in ("chromium-headless-shell", "chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("headless Chromium not found (chromium-headless-shell): it is a Debian package the suite needs; "
                "install it with `make os-deps` (as root)")


def _png_pixels(data: bytes) -> np.ndarray:
    """RGB pixels (H, W, 3) of an 8-bit, non-interlaced RGB or RGBA PNG (what Chromium writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, ihdr = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + n
    assert ihdr is not None
    w, h, depth, colour, _, _, interlace = ihdr
    assert depth == 8 and colour in (2, 6) and interlace == 0, ihdr
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = w * bpp
    rows: list[bytes] = []
    prev = bytes(stride)
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)]
        if f == 0:
            cur = line
        elif f == 2:  # up: vectorised
            cur = ((np.frombuffer(line, np.uint8).astype(np.uint16) + np.frombuffer(prev, np.uint8)) & 0xFF
                   ).astype(np.uint8).tobytes()
        else:  # sub, average, Paeth depend on the pixel to the left: byte by byte, on plain ints
            out = bytearray(stride)
            for i in range(stride):
                a = out[i - bpp] if i >= bpp else 0
                if f == 1:
                    pred = a
                elif f == 3:
                    pred = (a + prev[i]) >> 1
                else:
                    b = prev[i]
                    c = prev[i - bpp] if i >= bpp else 0
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                out[i] = (line[i] + pred) & 0xFF
            cur = bytes(out)
        rows.append(cur)
        prev = cur
    return np.frombuffer(b"".join(rows), np.uint8).reshape(h, w, bpp)[:, :, :3]


def _hex(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


@pytest.mark.slow  # starts a headless Chromium
def test_headless_chromium_draws_the_figures(tmp_path, kinds):
    chromium = _chromium()
    body, stations = kinds["base_frame"]
    page = tmp_path / "report.html"
    page.write_text(R.render_report(body, stations=stations, drift_checks=drift_history()), encoding="utf-8")
    shot = tmp_path / "shot.png"
    proc = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
         "--disable-extensions", "--force-device-scale-factor=1", "--window-size=1100,6000",
         f"--screenshot={shot}", page.as_uri()],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert shot.exists() and shot.stat().st_size > 0, f"no screenshot (exit {proc.returncode}):\n{proc.stderr[-2000:]}"
    px = _png_pixels(shot.read_bytes())
    assert px.shape[0] >= 3000 and px.shape[1] >= 1000, px.shape
    background = np.all(px >= 0xF0, axis=2)  # white page, light panels and table shading
    ink = 1.0 - float(background.mean())
    assert ink > 0.04, f"the screenshot is (nearly) blank: {ink:.3%} non-background pixels"
    # every figure's own colour is on the page, in solid areas (bars, bands, thick lines)
    counts = {name: int(np.all(px == np.array(_hex(c)), axis=2).sum()) for name, c in
              (("fit", R._FIT), ("held-out", R._HELD), ("warn band", R._WARN_BAND), ("fail band", R._FAIL_BAND),
               ("cusum", R._CUSUM))}
    assert all(n >= 50 for n in counts.values()), counts
    distinct = {tuple(v) for v in px[::7, ::7].reshape(-1, 3)}
    assert len(distinct) > 50, f"only {len(distinct)} distinct colours: the figures are not drawn"


def test_the_report_file_is_what_chromium_opens_without_network(tmp_path, kinds):
    """The document is complete on its own: copied anywhere, it still parses and names no file."""
    body, stations = kinds["hand_eye"]
    p = R.write_report(tmp_path, 3, R.render_report(body, stations=stations))
    moved = Path(shutil.copy(p, tmp_path / "elsewhere.html"))
    assert _ids(_parse(moved.read_text(encoding="utf-8")), "figure") == list(R.FIGURES)


def test_a_suspect_result_says_so_first(kinds):
    body, stations = copy.deepcopy(kinds["base_frame"])
    body.update(suspect=True, suspect_reason="drift check: 0.950 mm", active=False)
    root = _parse(R.render_report(body, stations=stations))
    summary = [s for s in root.iter(XHTML + "section") if s.get("id") == "summary"][0]
    banner = [p for p in summary.iter(XHTML + "p") if p.get("class") == "banner"]
    assert banner and "SUSPECT: drift check: 0.950 mm" in "".join(banner[0].itertext())
    assert "not active" in "".join(summary.itertext())


# --------------------------------------------------------------------------------------
# kinematics


@pytest.fixture(scope="module")
def kinematics():
    return kinematics_kind()


def _section(root: ET.Element, sec_id: str) -> ET.Element:
    (sec,) = [s for s in root.iter(XHTML + "section") if s.get("id") == sec_id]
    return sec


def _rows(root: ET.Element, cls: str) -> list[list[str]]:
    (table,) = [t for t in root.iter(XHTML + "table") if t.get("class") == cls]
    return [["".join(td.itertext()) for td in tr.iter(XHTML + "td")] for tr in table.iter(XHTML + "tr")
            if tr.find(XHTML + "td") is not None]


def _nominal_edge(name: str) -> float:
    """The nominal UR5e's value of ``name`` in the report's units (mm, deg), from the solver's model."""
    head, kind = name.split(".")
    if kind == "zero_offset":
        return 0.0
    v = float(getattr(UR5E, kind)[int(head[4:]) - 1])
    return v * 1e3 if kind in ("a", "d") else float(np.degrees(v))


def test_a_kinematics_result_shows_its_identification(kinematics):
    body, stations, result = kinematics
    text = R.render_report(body, stations=stations, drift_checks=drift_history())
    root = _parse(text)  # still well-formed XML
    want = list(R.SECTIONS)
    want.insert(1, KR.KINEMATICS_SECTION)
    assert _ids(root, "section") == want
    assert _ids(root, "figure") == [KR.KINEMATICS_FIGURE, *R.FIGURES]
    sec = _section(root, KR.KINEMATICS_SECTION)
    assert sec.find(XHTML + "h2").text == "Kinematic identification"
    # one row per identified parameter, in the result's order: nominal, identified, delta, 1-sigma at the edge
    rows = _rows(root, "kinematic-parameters")
    assert [r[0] for r in rows] == list(result.estimated) and len(rows) > 10
    for name, unit, nom, ident, delta, sigma in rows:
        length = name.endswith((".a", ".d"))
        f, tol = (1e3, 0.51e-5) if length else (float(np.degrees(1.0)), 0.51e-6)  # half the last digit shown
        assert unit == ("mm" if length else "deg"), name
        np.testing.assert_allclose(float(nom), _nominal_edge(name), atol=tol, err_msg=name)
        np.testing.assert_allclose(float(ident), result.parameters[name] * f, atol=tol, err_msg=name)
        np.testing.assert_allclose(float(delta), result.deltas[name] * f, atol=tol, err_msg=name)
        np.testing.assert_allclose(float(sigma), result.sigmas[name] * f, atol=tol, err_msg=name)
        assert float(sigma) >= 10 * tol, name  # at least two significant digits
    # the unidentifiable ones, each with its reason (this arm: the structural folds)
    un = _rows(root, "unidentifiable")
    assert [r[0] for r in un] == list(result.unidentifiable)
    assert {"joint1.zero_offset", "link2.d"} <= {r[0] for r in un}
    for name, why in un:
        assert why and why == result.unidentifiable_reasons[name], name
    assert "folded into the base frame" in dict(un)["joint1.zero_offset"]
    summary = " ".join("".join(_section(root, "summary").itertext()).split())
    assert f"identify_kinematics; converged ({result.stop_reason})" in summary
    facts = dict((r[0], r[1]) for r in _rows(root, "kinematic-facts"))
    assert facts["condition number (column-normalised Jacobian)"] == f"{result.condition_number:.1f}"
    # held-out validation before (nominal arm) and after, in mm: identification removed the kinematic error
    val = {r[0]: (float(r[1]), float(r[2])) for r in _rows(root, "kinematic-validation")}
    v = result.validation
    for label, field in (("RMS [mm]", "rms_translation_m"), ("P50 [mm]", "p50_translation_m"),
                         ("P90 [mm]", "p90_translation_m"), ("max [mm]", "max_translation_m")):
        np.testing.assert_allclose(val[label], (getattr(v.before, field) * 1e3, getattr(v.after, field) * 1e3),
                                   atol=1e-4)
    assert val["RMS [mm]"][1] < 0.2 * val["RMS [mm]"][0]
    assert "orientation RMS [deg]" in val  # pose measurements: the orientation closure too
    # no ISO 9283 figures in a run's result: the report says where they come from
    sec_text = " ".join("".join(sec.itertext()).split())
    assert "ISO 9283" in sec_text and "bench/kinematics_bench.py" in sec_text
    assert not [t for t in sec.iter(XHTML + "table") if t.get("class") == "iso9283"]
    # the stations are drawn through the identified arm: their residuals are the fit's own
    res = "".join(_figure(root, "fig-residuals").itertext())
    assert f"(longest {max(body['residuals']['translation_m']) * 1e3:.4f} mm)" in res
    assert _classes(_figure(root, "fig-residuals")).count("residual") == 2 * len(stations)
    # deterministic, like every report
    assert text == R.render_report(copy.deepcopy(body), stations=copy.deepcopy(stations),
                                   drift_checks=drift_history())


def test_a_kinematics_result_with_iso9283_figures_shows_them(kinematics):
    body, stations, _ = kinematics
    body = copy.deepcopy(body)
    body["kinematics"]["iso9283"] = {"before": {"max_ap_m": 1.25e-3, "max_rp_m": 4.0e-5},
                                     "after": {"max_ap_m": 8.0e-5, "max_rp_m": 4.1e-5}}
    root = _parse(R.render_report(body, stations=stations))
    assert _rows(root, "iso9283") == [["before", "1.2500", "0.0400"], ["after", "0.0800", "0.0410"]]
    assert "bench/kinematics_bench.py" not in "".join(_section(root, KR.KINEMATICS_SECTION).itertext())


def test_a_kinematics_result_shows_the_identifications_warnings(kinematics):
    body, stations, _ = kinematics
    body = copy.deepcopy(body)
    body["kinematics"]["warnings"] = [{"code": "model_error", "message": "chi-square per dof 3.1 beyond 1.2",
                                       "value": 3.1}]
    root = _parse(R.render_report(body, stations=stations))
    warns = "".join(_section(root, "warnings").itertext())
    assert "model_error" in warns and "chi-square per dof 3.1 beyond 1.2" in warns
    assert "No warnings" not in warns


def test_a_kinematics_result_without_its_block_still_has_the_section(kinematics):
    body, _, _ = kinematics
    body = {k: v for k, v in body.items() if k != "kinematics"}
    root = _parse(R.render_report(body))
    assert "no kinematics block" in "".join(_section(root, KR.KINEMATICS_SECTION).itertext())
    assert _ids(root, "figure") == list(R.FIGURES)


def test_a_stored_kinematics_result_reports_from_the_store(tmp_path, kinematics):
    """What the daemon writes: the result and its run's stations read back from the real store
    (``StationRecord``, the controller's nominal FK), drawn through the identified arm."""
    body, stations, _ = kinematics
    with Store(tmp_path / "state").open() as store:
        run = store.create_run("kinematics", {"identification": {"n_fit": len(stations)}},
                               config_sha256="ab" * 32, devices={})
        for s in stations:
            rec = dataclasses.replace(make_station(s["plan_index"]), base_T_flange=s["base_T_flange"],
                                      q_rad=s["q_rad"], cell_T_target=s["cell_T_target"],
                                      cell_p_target=s["cell_T_target"][:3, 3].copy())
            store.add_station(run, rec)
        rid = store.add_result(run, "kinematics", body, {})
        text = R.report_from_store(store, rid)
    root = _parse(text)
    assert _ids(root, "section")[:2] == ["summary", KR.KINEMATICS_SECTION]
    assert [r[0] for r in _rows(root, "kinematic-parameters")] == list(body["kinematics"]["parameters"])
    res = _figure(root, "fig-residuals")
    assert _classes(res).count("residual") == 2 * len(stations)
    assert f"(longest {max(body['residuals']['translation_m']) * 1e3:.4f} mm)" in "".join(res.itertext())


def test_a_kinematics_result_maps_its_residuals_before_and_after(kinematics):
    """The section's "before" map draws the nominal arm with its own rigid fit; the residual
    figure the identified arm: the hidden kinematic errors make the vectors before far
    longer than after (mm against the tracker's hundredths of a mm)."""
    body, stations, _ = kinematics
    assert body["kinematics"]["nominal_fit"]["transforms"]["cell_T_base"]
    root = _parse(R.render_report(body, stations=stations))
    sec = _section(root, KR.KINEMATICS_SECTION)
    before = [f for f in sec.iter(XHTML + "figure") if f.get("id") == KR.KINEMATICS_FIGURE]
    assert len(before) == 1 and before[0].find(XHTML + "figcaption") is not None

    def longest_mm(fig) -> float:
        text = "".join(fig.itertext())
        return float(text.split("(longest ")[1].split(" mm")[0])

    after = [f for f in root.iter(XHTML + "figure") if f.get("id") == "fig-residuals"][0]
    assert longest_mm(before[0]) > 10 * longest_mm(after), (longest_mm(before[0]), longest_mm(after))
    # A body stored before the nominal fit was kept: no "before" figure, nothing broken.
    old = copy.deepcopy(body)
    del old["kinematics"]["nominal_fit"]
    assert _ids(_parse(R.render_report(old, stations=stations)), "figure") == list(R.FIGURES)
