"""Bad input through the real command line: every case exits 2 with one line naming the key
or argument and a bounded excerpt of the value, shows no traceback and writes nothing."""

from __future__ import annotations

import math
import tracemalloc
from pathlib import Path

import pytest
import yaml
from phasesweep.pipeline.spec import EXCERPT_CHARS, MAX_YAML_NODES, SpecError, excerpt, load_raw

from phasesweep._cli import build_parser, main

#: (dotted key, value, words the message must show): finite floats only, everywhere.
NOT_FINITE = [
    ("train.lr", math.inf, "inf"),
    ("train.lr", math.nan, "nan"),
    ("model.init_scale", math.inf, "inf"),
    ("data.noise_sigma", math.inf, "inf"),
    ("train.divergence_factor", math.inf, "inf"),
    ("train.lr_scaling.init_scale_power", math.nan, "nan"),
    ("train.lr_scaling.width_power", -math.inf, "-inf"),
    ("model.layer_scales", [1.0, math.nan], "nan"),
    ("analysis.escape_eps", math.nan, "nan"),
    ("metrics.spectra_budget", math.inf, "inf"),
    ("grid.init_scale", [1.0, math.inf], "inf"),
    ("grid.lr", [0.1, math.nan], "nan"),
]

#: (dotted key, value, the key named, words the message must show)
BAD_SPECS = [
    *[
        (key, value, key.replace(".layer_scales", ".layer_scales.1"), shown)
        for key, value, shown in NOT_FINITE
    ],
    ("grid.lr", {"logspace": [0, 400, 3]}, "grid.lr", "not a finite number"),
    ("grid.seed", {"range": [0, 10, 0]}, "grid.seed", "step must not be 0"),
    ("grid.seed", {"range": [0, 10**9]}, "grid", "max_points"),
    ("grid.init_scale", {"logspace": [-3, 1, 10**12]}, "grid", "max_points"),
    ("name", "abc\n", "name", r"'abc\n'"),
    ("model.widht", 3, "model.widht", "did you mean model.width?"),
    ("train.lr_scaling.widht_power", 1.0, "train.lr_scaling.widht_power", "width_power?"),
    ("grid.widht", [8, 16], "grid.widht", "did you mean width?"),
    ("grid", {"model.widht": [8, 16]}, "grid.model.widht", "did you mean model.width?"),
    ("grid", {"model": [8]}, "grid.model", "unknown axis"),
    (
        "plots",
        [{"kind": "loss_curves", "valeu": "x"}],
        "plots.0.valeu",
        "(did you mean plots.0.value?)",
    ),
    ("plots", [{"kind": "loss_curves", "name": "a\n"}], "plots.0.name", r"'a\n'"),
    (
        "plots",
        [{"kind": "loss_curves", "where": "seed = 0; COPY runs TO 'x.csv'"}],
        "plots[0].where",
        "not one SQL condition",
    ),
    ("grid", {"train.lr_scaling.nope": [1.0]}, "grid.train.lr_scaling.nope", "unknown axis"),
]


def _refused(capsys, args: list[str], store: Path, *shown: str) -> str:
    """Run the CLI; assert exit 2, the message's last line showing ``shown``, no traceback
    and an untouched store. Returns that line."""
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = err.rstrip("\n").splitlines()[-1]
    for words in shown:
        assert words in line, line
    assert len(line) < 6 * EXCERPT_CHARS, line
    assert not store.exists() or not any(store.iterdir())
    return line


@pytest.mark.parametrize("key,value,named,shown", BAD_SPECS)
def test_bad_spec_values(tmp_path, capsys, tiny_spec, key, value, named, shown):
    store = tmp_path / "store"
    spec = tiny_spec({key: value})
    line = _refused(capsys, ["run", str(spec), "--store", str(store)], store, named, shown)
    assert line.startswith(f"phasesweep: invalid spec: {named} = ")


def test_bad_override_values(tmp_path, capsys, tiny_spec):
    store = tmp_path / "store"
    run = ["run", str(tiny_spec()), "--store", str(store)]
    _refused(capsys, [*run, "--set", "train.lr=.inf"], store, "train.lr = inf", "finite")
    _refused(capsys, [*run, "--set", "grid.seed={range: [0, 1000000000]}"], store, "max_points")
    _refused(capsys, [*run, "--set", "modle.width=3"], store, "modle", "did you mean model?")


def test_the_first_error_names_the_key_also_from_python():
    raw = {"name": "x", "model": {"init_scale": math.inf}}
    from phasesweep.pipeline.spec import validate_spec

    with pytest.raises(SpecError) as err:
        validate_spec(raw)
    assert (err.value.key, err.value.value) == ("model.init_scale", math.inf)


def _write(tmp_path: Path, name: str, data: bytes | str) -> Path:
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def _laughs(levels: int = 9) -> str:
    """The "billion laughs" document: 10**levels strings from a few hundred bytes."""
    lines = ["name: lol", 'l0: "lol"']
    for i in range(1, levels + 1):
        lines[-1] = lines[-1].replace(f"l{i - 1}:", f"l{i - 1}: &l{i - 1}")
        lines.append(f"l{i}: [" + ", ".join([f"*l{i - 1}"] * 10) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "content,shown",
    [
        (bytes(range(256)) * 8, "not UTF-8 text (byte 0x80 at offset 128)"),
        ("name: x\x00\n", "malformed YAML: unacceptable character #x0000"),
        ("[" * 5000 + "]" * 5000, "YAML refused: nested deeper than 64 levels"),
        ("a: " + "{b: " * 5000 + "1" + "}" * 5000, "nested deeper than 64 levels"),
        ("- &a [*a]\n", "an alias refers to a node that contains it"),
        ("- a\n- b\n", "top level must be a mapping"),
        ("name: x\nmodel: {depth: [1,\n", "malformed YAML"),
    ],
)
def test_bad_spec_files(tmp_path, capsys, content, shown):
    store = tmp_path / "store"
    spec = _write(tmp_path, "spec.yaml", content)
    _refused(capsys, ["run", str(spec), "--store", str(store)], store, "SPEC = ", shown)


def test_alias_bomb_is_refused_in_bounded_memory_with_a_short_message(tmp_path, capsys):
    """The document expands to 10**9 strings; refusing it builds none of them (peak memory
    below what a list of MAX_YAML_NODES references alone takes) and prints no expansion."""
    store = tmp_path / "store"
    spec = _write(tmp_path, "bomb.yaml", _laughs())
    line = _refused(
        capsys, ["run", str(spec), "--store", str(store)], store, "YAML refused", "aliases"
    )
    assert str(MAX_YAML_NODES) in line
    tracemalloc.start()
    try:
        with pytest.raises(SpecError, match="aliases expand it to more than"):
            load_raw(spec)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * MAX_YAML_NODES / 10, peak
    # the same bomb as a --set value; a document of 10**5 expanded nodes still parses
    run = ["run", str(_write(tmp_path, "ok.yaml", "name: ok\n")), "--store", str(store)]
    bomb = "{" + _laughs().replace("\n", ", ").replace("name: lol, ", "").rstrip(", ") + "}"
    _refused(capsys, [*run, "--set", f"description={bomb}"], store, "description", "refused")
    small = load_raw(_write(tmp_path, "small.yaml", _laughs(5)))
    assert len(small["l5"]) == 10 and small["l5"][0][0][0][0][0] == "lol"


def test_endless_or_huge_spec_file_is_not_read_whole(tmp_path, capsys):
    store = tmp_path / "store"
    if Path("/dev/zero").exists():
        _refused(capsys, ["run", "/dev/zero", "--store", str(store)], store, "larger than")
    _refused(capsys, ["run", str(tmp_path), "--store", str(store)], store, "cannot read")


@pytest.mark.parametrize(
    "option,value,shown",
    [
        ("--cpus-per-trial", "nan", "is not a finite number > 0"),
        ("--cpus-per-trial", "inf", "is not a finite number > 0"),
        ("--cpus-per-trial", "-1", "is not a finite number > 0"),
        ("--gpus-per-trial", "nan", "is not a finite number >= 0"),
        ("--gpus-per-trial", "-inf", "is not a finite number >= 0"),
        ("--max-retries", "1.5", "is not an integer >= 0"),
        ("--address", "not a host", "is not auto, local, standing, HOST:PORT or ray://HOST:PORT"),
        ("--address", "127.0.0.1", "is not auto, local, standing, HOST:PORT or ray://HOST:PORT"),
        (
            "--address",
            "ray://host:99999",
            "is not auto, local, standing, HOST:PORT or ray://HOST:PORT",
        ),
        ("--store", "", "is empty"),
        ("--store", "  ", "is empty"),
    ],
)
def test_bad_arguments(tmp_path, capsys, tiny_spec, monkeypatch, option, value, shown):
    monkeypatch.chdir(tmp_path)  # an empty --store must not mean the current folder
    store = tmp_path / "store"
    spec = tiny_spec()
    args = ["run", str(spec), "--store", str(store), f"{option}={value}"]
    _refused(capsys, args, store, f"argument {option}: {excerpt(value)} {shown}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]


def test_a_file_is_not_a_store(tmp_path, capsys, tiny_spec):
    spec = tiny_spec()
    for command in (["run", str(spec)], ["status"], ["query", "SELECT 1"], ["analyze", "tiny"]):
        for store, shown in ((spec, "is a file"), (spec / "store", "is below the file")):
            assert main([*command, "--store", str(store)]) == 2
            err = capsys.readouterr().err
            # the path as given, or cut in the middle where long ("/tmp/…/spec.yaml/store")
            assert "argument --store: '" in err and f"' {shown}" in err, err
            assert str(store)[:12] in err and "Traceback" not in err
            assert spec.is_file() and yaml.safe_load(spec.read_text())["name"] == "tiny"


def test_long_values_are_cut_in_the_message(tmp_path, capsys, tiny_spec):
    store = tmp_path / "store"
    spec = tiny_spec({"model.activation": "x" * 100_000, "data.kind": ["y"] * 2000})
    line = _refused(capsys, ["run", str(spec), "--store", str(store)], store, "model.activation")
    assert "…" in line or "..." in line
    assert main(["run", str(tiny_spec()), "--store", str(store), "--address", "z" * 10**5]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()[-1]) < 6 * EXCERPT_CHARS


def test_excerpts_are_bounded_for_any_value():
    deep: list = []
    node = deep
    for _ in range(10_000):
        node.append([])
        node = node[0]
    cyclic: list = [1]
    cyclic.append(cyclic)
    shared = ["lol"]
    for _ in range(40):  # 2**40 leaves if expanded
        shared = [shared, shared]
    for value in (deep, cyclic, shared, "a\nb" * 10**6, {str(i): i for i in range(10**5)}):
        text = excerpt(value)
        assert len(text) <= EXCERPT_CHARS and "\n" not in text
    assert excerpt("abc\n") == r"'abc\n'"


@pytest.mark.parametrize(
    "address",
    ["auto", "local", "127.0.0.1:6379", "ray://127.0.0.1:10001", "head-1.lan:6379", "[::1]:6379"],
)
def test_good_addresses_parse(address):
    args = build_parser().parse_args(["run", "s.yaml", "--address", address])
    assert args.address == address


def test_real_process_refuses_deep_and_bomb_specs(tmp_path, phasesweep_cli):
    """In a process of its own (the real stack depth and memory): exit 2, one line each."""
    store = tmp_path / "store"
    for name, content in (
        ("deep.yaml", "[" * 100_000 + "]" * 100_000),
        ("bomb.yaml", _laughs()),
        ("binary.yaml", bytes(range(256))),
    ):
        spec = _write(tmp_path, name, content)
        proc = phasesweep_cli(["run", str(spec), "--store", str(store)])
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 2, err
        assert err.count("\n") == 1 and err.startswith("phasesweep: invalid spec: SPEC = "), err
        assert not store.exists()


@pytest.mark.parametrize(
    "changes,named",
    [
        (  # 1e-200 ** -2 overflows a float
            {"grid.init_scale": [1.0, 1e-200], "train.lr_scaling.init_scale_power": -2.0},
            "grid = {'init_scale': 1e-200, 'seed': 0}",
        ),
        (  # underflows to lr 0
            {"train.lr": 1e-300, "train.lr_scaling.width_power": -100.0},
            "grid = {'init_scale': 0.5, 'seed': 0}",
        ),
        (
            {"grid": {}, "model.init_scale": 1e-300, "train.lr_scaling.init_scale_power": -2.0},
            "train.lr_scaling = {",
        ),
    ],
)
def test_scaled_learning_rate_must_be_finite_and_positive(
    tmp_path, capsys, tiny_spec, changes, named
):
    store = tmp_path / "store"
    spec = tiny_spec(changes)
    _refused(capsys, ["run", str(spec), "--store", str(store)], store, named, "not a finite")
