"""`python -m convtune tune --file`: shape spec strings, JSON and text shape files, their
errors (file and line), one progress display across the list, and the summary table."""

from __future__ import annotations

import io
import json
import re
import sys

import pytest

import convtune
import convtune.__main__ as cli
from convtune._shapes import Shape, ShapeError, from_json, load, parse_spec
from convtune._tuning import ListProgress
from tuning_support import tuning_env  # noqa: F401  (a fixture)

TINY = ["1x4x6x6 k4 3x3 s1 p1", "1x4x7x7 k8 3x3 s2 p1 g2"]


@pytest.mark.parametrize("spec", [
    "8x64x56x56 k64 3x3 s1 p1",
    "1x6x9x9 k4 3x3 s1 p0 g2",
    "2x3x11x12 k5 3x1 s2,1 p1,0 d2 +b",
    "1x4x8x8 k4 3x3 s1 psame",
    "1x4x8x8 k4 2x2 s1 pvalid d1,2",
    "1x8x9x9 k4 3x3 s1 p1 +b nhwc",
    "1x8x9x9 k4 3x3 s1 p1 f16",
    "2x8x9x9 k4 3x3 s2 p1 nhwc f16",
])
def test_spec_strings_round_trip(spec):
    assert parse_spec(spec).label() == spec


def test_spec_fields_and_defaults():
    s = parse_spec("2x6x9x10 k4 3x1 g3 +b s2")
    assert s == Shape(x=(2, 6, 9, 10), w=(4, 2, 3, 1), stride=(2, 2), padding=(0, 0), groups=3, bias=True)
    assert s.out_hw() == (4, 5)  # (9 - 3) // 2 + 1, (10 - 1) // 2 + 1
    assert s.flops() == 2.0 * 2 * 4 * (4 * 5) * 2 * 3 * 1  # 2 N K OH OW C/groups R S


@pytest.mark.parametrize("spec, match", [
    ("8x64x56 k64 3x3", "not NxCxHxW"),
    ("8x64x56x56 64 3x3", "not kK"),
    ("8x64x56x56 k64 3", "not RxS"),
    ("8x64x56x56 k64", "incomplete"),
    ("8x64x56x56 k64 3x3 q2", "unrecognised 'q2'"),
    ("8x64x56x56 k64 3x3 s1 s2", "stride given twice"),
    ("1x6x8x8 k4 3x3 g4", "divide C=6"),
    ("1x6x8x8 k4 3x3 pfull", "unrecognised"),
])
def test_bad_specs_raise_value_errors_naming_the_token(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_spec(spec)


def test_json_objects():
    s = from_json({"x": [1, 4, 8, 8], "w": [6, 2, 3, 3], "stride": [2, 1], "padding": "same",
                   "groups": 2, "bias": True})
    assert s.label() == "1x4x8x8 k6 3x3 s2,1 psame g2 +b"
    assert from_json("1x4x8x8 k4 3x3 s1 p1") == parse_spec("1x4x8x8 k4 3x3 s1 p1")
    for bad, match in [
        ({"x": [1, 4, 8, 8]}, "missing 'w'"),
        ({"x": [1, 4, 8], "w": [4, 4, 3, 3]}, "x must be a list of 4"),
        ({"x": [1, 4, 8, 8], "w": [4, 4, 3, 3], "pad": 1}, "unknown key.*'pad'"),
        ({"x": [1, 4, 8, 8], "w": [4, 4, 3, 3], "stride": 1.5}, "stride must be an integer"),
        ({"x": [1, 4, 8, 8], "w": [4, 4, 3, 3], "bias": 1}, "bias must be true or false"),
        ({"x": [1, 4, 8, 8], "w": [4, 4, 3, 3], "padding": "full"}, "padding must be"),
        (7, "expected an object"),
    ]:
        with pytest.raises(ValueError, match=match):
            from_json(bad)


def test_text_files_skip_comments_and_name_the_bad_line(tmp_path):
    f = tmp_path / "shapes.txt"
    f.write_text(f"# a comment\n\n{TINY[0]}   # trailing\n  {TINY[1]}\n")
    assert [(w, s.label()) for w, s in load(f)] == [(f"{f}:3", TINY[0]), (f"{f}:4", TINY[1])]
    f.write_text(f"{TINY[0]}\n# fine\n1x4x6x6 k4 3z3\n")
    with pytest.raises(ShapeError, match=re.escape(f"{f}:3: ") + ".*'3z3' is not RxS"):
        load(f)
    f.write_text("# nothing\n")
    with pytest.raises(ShapeError, match="no shapes"):
        load(f)
    with pytest.raises(ShapeError, match="cannot read"):
        load(tmp_path / "missing.txt")


def test_json_files(tmp_path):
    f = tmp_path / "shapes.json"
    f.write_text(json.dumps([{"x": [1, 4, 6, 6], "w": [4, 4, 3, 3], "padding": 1}, TINY[1]]))
    assert [s.label() for _, s in load(f)] == TINY
    f.write_text(json.dumps({"shapes": [TINY[0]]}))
    assert [s.label() for _, s in load(f)] == TINY[:1]
    f.write_text('[\n  {"x": [1, 4, 6, 6], "w": [4, 4, 3, 3]},\n  {"x": [1, 4, 6, 6] "w": []}\n]')
    with pytest.raises(ShapeError, match=re.escape(f"{f}:3:") + ".*invalid JSON"):
        load(f)
    f.write_text(json.dumps([TINY[0], {"x": [1, 4, 6, 6], "w": [4, 4, 3, 3], "dilate": 2}]))
    with pytest.raises(ShapeError, match=re.escape(f"{f}: item 2: unknown key")):
        load(f)


@pytest.fixture
def plain_display(monkeypatch):
    """The display without tqdm, whether or not it is installed (these tests read its text)."""
    monkeypatch.setitem(sys.modules, "tqdm", None)


def test_list_progress_is_one_display_that_only_moves_forward(plain_display):
    buf = io.StringIO()
    p = ListProgress(2, stream=buf, force=True)
    p.start(0, "a")
    for done in range(4):
        p(done, 4, f"cand{done}", "a")
    p.finish()
    p.start(1, "b")  # a cached shape: no callbacks
    p.finish()
    p.close()
    out = buf.getvalue()
    assert "\n" not in out
    positions = [float(m) for m in re.findall(r"\[(\d+\.\d)/2 shapes\]", out)]
    assert positions[0] == 0.0 and positions[-1] == 2.0
    assert positions == sorted(positions) and 0.5 in positions


def test_list_progress_write_prints_between_redraws(plain_display, capsys):
    buf = io.StringIO()
    p = ListProgress(1, stream=buf, force=True)
    p.start(0, "a")
    p.write("a point")
    p.close()
    assert capsys.readouterr().out == "a point\n"
    drawn = buf.getvalue()
    # Drawn, cleared for the printed line, drawn again, cleared at the end.
    assert drawn.count("[0.0/1 shapes] a") == 2 and drawn.endswith("\r")


def test_cli_tunes_a_file_under_one_progress_display(plain_display, tuning_env, tmp_path, monkeypatch, capsys):
    f = tmp_path / "shapes.txt"
    f.write_text("\n".join(TINY) + "\n")
    displays = []

    def forced(count):
        displays.append((count, io.StringIO()))
        return ListProgress(count, stream=displays[-1][1], force=True)

    monkeypatch.setattr(cli, "ListProgress", forced)
    assert cli.main(["tune", "--file", str(f), "--budget", "0", "--reps", "2"]) == 0
    out = capsys.readouterr().out
    assert len(displays) == 1 and displays[0][0] == 2
    shown = displays[0][1].getvalue()
    assert "[2.0/2 shapes]" in shown and TINY[1] in shown
    rows = [line for line in out.splitlines() if line.startswith(("1x4x6x6", "1x4x7x7"))]
    assert [r.split("  ")[0] for r in rows] == TINY
    assert all(" tuned " in r for r in rows) and "2 shapes" in out
    # Each row's numpy-in, numpy-out time, next to the GPU-timed one.
    header = next(line for line in out.splitlines() if line.startswith("shape"))

    def column(name):  # cells are right-aligned under their header
        end = header.index(name) + len(name)
        return [float(r[:end].split()[-1]) for r in rows]

    tuned, e2e = column("tuned ms"), column("e2e ms")
    assert all(e > 0 for e in e2e) and all(e >= 0.5 * t for e, t in zip(e2e, tuned))


def test_cli_reports_bad_lines_before_tuning_anything(tuning_env, tmp_path, capsys):
    f = tmp_path / "shapes.txt"
    # Syntax error on line 3, and a shape convtune rejects (C/groups != w's) on line 2.
    f.write_text(f"{TINY[0]}\n1x4x6x6 k4 3x3 s0\n1x4x6x6 k4 3x3 s1 x\n")
    assert cli.main(["tune", "--file", str(f), "--budget", "0"]) == 2
    assert f"{f}:3: " in capsys.readouterr().err
    f.write_text(f"{TINY[0]}\n1x4x6x6 k4 3x3 s0\n")
    assert cli.main(["tune", "--file", str(f), "--budget", "0"]) == 2
    err = capsys.readouterr().err
    assert f"{f}:2: 1x4x6x6 k4 3x3 s0 p0: " in err and "stride" in err and "Traceback" not in err
    assert not tuning_env.exists() or not any(tuning_env.iterdir())


def test_cli_file_and_suite_exclude_each_other(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["tune", "--file", "x.txt", "--suite", "default"])
    assert e.value.code == 2


def test_layout_and_dtype_in_specs_and_json_match_the_tuner_s_labels(tuning_env):
    s = parse_spec("1x8x9x7 k4 3x3 s1 p1 nhwc f16")
    assert (s.layout, s.dtype) == ("NHWC", "float16")
    assert s.args()[0] == (1, 9, 7, 8)  # x in the layout's order
    assert s.kwargs() == {"layout": "NHWC", "dtype": "float16"}
    assert from_json({"x": [1, 8, 9, 7], "w": [4, 8, 3, 3], "padding": 1, "layout": "NHWC",
                      "dtype": "float16"}) == s
    for bad, match in [({"layout": "CHW"}, "layout must be"), ({"dtype": "half"}, "dtype must be")]:
        with pytest.raises(ValueError, match=match):
            from_json({"x": [1, 8, 9, 7], "w": [4, 8, 3, 3], **bad})
    # What the tuner reports as the shape reads back as the same problem.
    report = convtune.tune(*s.args(), **s.kwargs())
    assert parse_spec(report.shape) == s
    assert convtune.default_variant(*s.args(), **s.kwargs())


def test_cli_tunes_the_layout_and_dtype_a_line_names(tuning_env, tmp_path):
    spec = "1x8x9x7 k4 3x3 s1 p1 nhwc f16"
    s = parse_spec(spec)
    f = tmp_path / "shapes.txt"
    f.write_text(spec + "\n")
    assert cli.main(["tune", "--file", str(f), "--budget", "0", "--reps", "2"]) == 0
    # The cache holds that problem (float16, NHWC), not its float32 NCHW namesake.
    assert convtune.explain(*s.args(), **s.kwargs()).source == "cache"
    nchw = parse_spec("1x8x9x7 k4 3x3 s1 p1")
    assert convtune.explain(*nchw.args(), **nchw.kwargs()).source != "cache"



@pytest.mark.parametrize("spec", [
    "1x8x9x9 k4 4x4 s2 p1 T",
    "2x6x7x5 k9 3x3 s2,3 p1,0 d2 T op1,0 g3 +b nhwc",
])
def test_transposed_spec_strings_round_trip(spec):
    assert parse_spec(spec).label() == spec


def test_transposed_specs_and_json_describe_conv_transpose2d(tuning_env, tmp_path):
    s = parse_spec("1x8x9x9 k6 3x3 s2 p1 T op1 g2 +b")
    # w is (C, K/groups, R, S), as PyTorch's conv_transpose2d takes it.
    assert s.w == (8, 3, 3, 3) and s.out_channels() == 6 and s.transposed
    assert s.out_hw() == (18, 18)  # (9 - 1) * 2 - 2 + 2 + 1 + 1
    assert s.flops() == 2.0 * 1 * 8 * 9 * 9 * 3 * 3 * 3
    assert s.kwargs() == {"bias": True, "transposed": True, "output_padding": (1, 1)}
    assert from_json({"x": [1, 8, 9, 9], "w": [8, 3, 3, 3], "stride": 2, "padding": 1, "groups": 2,
                      "bias": True, "transposed": True, "output_padding": 1}) == s
    for bad, match in [("1x8x9x9 k6 3x3 s2 op1", "needs T"), ("1x8x9x9 k5 3x3 T g2", "dividing K=5"),
                       ("1x8x9x9 k6 3x3 psame T", "numeric padding")]:
        with pytest.raises(ValueError, match=match):
            parse_spec(bad)
    with pytest.raises(ValueError, match="needs"):
        from_json({"x": [1, 8, 9, 9], "w": [8, 3, 3, 3], "output_padding": 1})
    # What the tuner reports reads back as the same problem, and the CLI tunes it.
    report = convtune.tune(*s.args(), **s.kwargs(), budget=0)
    assert parse_spec(report.shape) == s
    f = tmp_path / "shapes.txt"
    f.write_text(s.label() + "\n")
    assert cli.main(["tune", "--file", str(f), "--budget", "0", "--reps", "2"]) == 0
    assert convtune.explain(*s.args(), **s.kwargs()).source == "cache"


@pytest.mark.parametrize("spec", [
    "1x8x9x9 k16 3x3 s1 p1 ps2",
    "2x6x7x5 k18 3x3 s2,1 p1,0 d2 g3 ps3 +b nhwc f16",
    "1x64x36x64 k1024 3x3 s1 p1 ps4",
])
def test_pixel_shuffle_spec_strings_round_trip(spec):
    assert parse_spec(spec).label() == spec


def test_pixel_shuffle_specs_and_json_describe_conv2d_pixel_shuffle(tuning_env, tmp_path):
    s = parse_spec("1x4x6x5 k8 3x3 s1 p1 ps2 +b")
    # w, K and the FLOPs are the conv's; the shuffle only moves where outputs are stored.
    assert s.pixel_shuffle == 2 and s.w == (8, 4, 3, 3) and s.out_channels() == 8
    assert s.flops() == 2.0 * 1 * 8 * 6 * 5 * 4 * 3 * 3
    assert s.kwargs() == {"bias": True, "pixel_shuffle": 2}
    assert from_json({"x": [1, 4, 6, 5], "w": [8, 4, 3, 3], "padding": 1, "bias": True,
                      "pixel_shuffle": 2}) == s
    # ps1 is no shuffle: the same problem, the same label (and cache key) as without it.
    assert parse_spec("1x4x6x5 k8 3x3 s1 p1 ps1 +b") == parse_spec("1x4x6x5 k8 3x3 s1 p1 +b")
    assert parse_spec("1x4x6x5 k8 3x3 s1 p1 ps1").label() == "1x4x6x5 k8 3x3 s1 p1"
    assert "ps" not in parse_spec("1x4x6x5 k8 3x3 s1 psame").label().replace("psame", "")
    # A transposed convolution's output shuffled: T and ps together, K its output channels.
    t = parse_spec("1x4x6x5 k8 4x4 s2 p1 T ps2")
    assert t.kwargs()["pixel_shuffle"] == 2 and parse_spec(t.label()) == t
    for bad, match in [
        ("1x4x6x5 k8 3x3 p1 ps0", "r must be >= 1"),
        ("1x4x6x5 k8 3x3 p1 ps-2", "unrecognised 'ps-2'"),
        ("1x4x6x5 k8 3x3 p1 ps3", r"divisible by r\*r = 9, got K=8"),
        ("1x4x6x5 k8 3x3 p1 ps2 ps2", "pixel_shuffle given twice"),
    ]:
        with pytest.raises(ValueError, match=match):
            parse_spec(bad)
    for bad, match in [
        ({"x": [1, 4, 6, 5], "w": [8, 4, 3, 3], "pixel_shuffle": 0}, "r must be >= 1"),
        ({"x": [1, 4, 6, 5], "w": [6, 4, 3, 3], "pixel_shuffle": 2}, "got K=6"),
        ({"x": [1, 4, 6, 5], "w": [4, 4, 3, 3], "pixel_shuffle": 2.0}, "pixel_shuffle must be an integer"),
        ({"x": [1, 8, 6, 5], "w": [8, 3, 4, 4], "transposed": True, "pixel_shuffle": 2}, "got K=3"),
    ]:
        with pytest.raises(ValueError, match=match):
            from_json(bad)
    # The tuner's report names the shuffled problem the same way, and the CLI tunes what a
    # line (or a JSON item) names: the shuffled problem, not its unshuffled namesake.
    report = convtune.tune(*s.args(), **s.kwargs(), budget=0)
    assert report.shape == s.label() and parse_spec(report.shape) == s
    f = tmp_path / "shapes.json"
    f.write_text(json.dumps([s.label()]))
    assert cli.main(["tune", "--file", str(f), "--budget", "0", "--reps", "2", "--force"]) == 0
    assert convtune.explain(*s.args(), **s.kwargs()).source == "cache"
    plain = parse_spec("1x4x6x5 k8 3x3 s1 p1 +b")
    assert convtune.explain(*plain.args(), **plain.kwargs()).source != "cache"
