"""Typed config: defaults, TOML + flag precedence, every kind of bad key or value named."""
import pytest

from scalesgd import config as C
from scalesgd.launch import make_parser, resolve_config


def cfg_from(argv, tmp_path=None, toml=None):
    if toml is not None:
        path = tmp_path / "job.toml"
        path.write_text(toml)
        argv = ["--config", str(path)] + argv
    return resolve_config(make_parser().parse_args(argv))


def test_defaults_are_the_demo_and_frozen():
    cfg = cfg_from([])
    assert cfg.model.model == "resnet20" and cfg.data.data == "" and cfg.train.method == "single"
    assert cfg.schedule.schedule == "cosine"
    assert cfg.schedule.epochs == cfg.train.epochs          # cosine horizon follows train.epochs
    with pytest.raises(AttributeError):
        cfg.model.model = "resnet50"


def test_file_then_flags_precedence(tmp_path):
    toml = '[model]\nmodel = "resnet18"\nwidth = 0.5\n[schedule]\nlr = 0.4\nmilestones = [10, 20]\n' \
           '[optim]\nnesterov = true\n'
    cfg = cfg_from(["--lr", "0.05", "--no-nesterov", "--milestones", "3,7.5"], tmp_path, toml)
    assert cfg.model.model == "resnet18" and cfg.model.width == 0.5     # from the file
    assert cfg.schedule.lr == 0.05                                      # flag beats file
    assert cfg.optim.nesterov is False
    assert cfg.schedule.milestones == (3.0, 7.5)


def test_the_demo_job_file_matches_the_defaults():
    cfg = cfg_from(["--config", "jobs/demo.toml"])
    assert cfg == cfg_from([])


@pytest.mark.parametrize("toml,message", [
    ('[model]\nmodle = "resnet18"\n', "model.modle: unknown key"),
    ('[modle]\nmodel = "resnet18"\n', "modle: unknown section"),
    ('[model]\nmodel = "resnet19"\n', "model.model: expected one of"),
    ('[model]\nwidth = 0\n', "model.width: must be > 0"),
    ('[model]\nwidth = "wide"\n', "model.width: expected a number"),
    ('[data]\nbatch_size = 1.5\n', "data.batch_size: expected an integer"),
    ('[data]\nflip = "yes"\n', "data.flip: expected true or false"),
    ('[data]\nscale = [40.0, 32.0]\n', "data.scale: lower bound"),
    ('[data]\nscale = [32.0]\n', "data.scale: expected 2 values"),
    ('[data]\naugment = "rrc"\nscale = [0.08, 2.0]\n', "data.scale: rrc takes area fractions"),
    ('[optim]\nmomentum = 1.5\n', "optim.momentum: must be <= 1"),
    ('[schedule]\nmilestones = [60, 30]\n', "schedule.milestones: must be increasing"),
    ('[schedule]\nschedule = "linear"\n', "schedule.schedule: expected one of"),
    ('[train]\nmethod = "hogwild"\n', "train.method: expected one of"),
    ('[dist]\nstraggler = "1:50:80"\n', "dist.straggler: expected RANKS:DELAY_MS"),
    ('[dist]\ngossip = "broadcast"\n', "dist.gossip: expected one of"),
    ('[train]\nmethod = "asgd"\n[dist]\nservers = 2\nmax_staleness = 3\n',
     "dist.max_staleness: needs dist.servers = 1 \\(got 2\\)"),
    ('[train]\ndevice = "tpu"\n', "train.device: expected one of"),
    ('model = "resnet18"\n', "model: expected a table"),
])
def test_bad_values_name_the_key(tmp_path, toml, message):
    with pytest.raises(C.ConfigError, match=message):
        cfg_from([], tmp_path, toml)


def test_bad_flag_value_names_the_key():
    with pytest.raises(C.ConfigError, match="data.batch_size: expected an integer, got 'many'"):
        cfg_from(["--batch-size", "many"])


def test_malformed_and_missing_files(tmp_path):
    with pytest.raises(C.ConfigError, match="job.toml: malformed TOML"):
        cfg_from([], tmp_path, "[model\nmodel=1")
    with pytest.raises(C.ConfigError, match="nope.toml: config file not found"):
        cfg_from(["--config", str(tmp_path / "nope.toml")])


def test_every_field_has_a_unique_flag_and_help():
    seen = set()
    for section in C.SECTIONS:
        for f, meta in C.fields_of(section):
            name = C.flag_name(section, f.name)
            assert name not in seen, name
            seen.add(name)
            assert meta.get("help"), f"{section}.{f.name} has no help text"


def test_docs_list_every_key_and_flag():
    """docs/cli.md is the user's reference: its key table is the generated one, verbatim."""
    from pathlib import Path
    text = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    assert C.reference_markdown() in text, \
        "docs/cli.md is stale: regenerate its table (see config/reference.py)"
    for section in C.SECTIONS:
        for f, _ in C.fields_of(section):
            assert f"`--{C.flag_name(section, f.name).replace('_', '-')}" in text, f.name


# ---------------------------------------------------------------- non-finite numbers, unreadable files
@pytest.mark.parametrize("argv,toml,message", [
    (["--lr", "nan"], None, "schedule.lr: expected a finite number, got 'nan'"),
    (["--lr", "inf"], None, "schedule.lr: expected a finite number, got 'inf'"),
    (["--lr", "1e999"], None, "schedule.lr: expected a finite number"),
    (["--momentum=-inf"], None, "optim.momentum: expected a finite number"),
    (["--scale", "32,inf"], None, "data.scale: expected a finite number"),
    (["--checkpoint-minutes", "NaN"], None, "train.checkpoint_minutes: expected a finite number"),
    ([], "[schedule]\nlr = nan\n", "schedule.lr: expected a finite number, got nan"),
    ([], "[data]\nmean = [inf, 0.0, 0.0]\n", "data.mean: expected a finite number"),
    ([], "[schedule]\nmilestones = [30.0, -inf]\n", "schedule.milestones: expected a finite number"),
])
def test_non_finite_numbers_are_refused_in_every_float_key(tmp_path, argv, toml, message):
    with pytest.raises(C.ConfigError, match=message):
        cfg_from(argv, tmp_path, toml)


def test_unreadable_config_files_name_the_path(tmp_path):
    with pytest.raises(C.ConfigError, match=f"{tmp_path}: is a directory, not a TOML config file"):
        cfg_from(["--config", str(tmp_path)])
    (tmp_path / "binary.toml").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(C.ConfigError, match="binary.toml: malformed TOML"):
        cfg_from(["--config", str(tmp_path / "binary.toml")])


def test_resume_errors_name_the_path_given(tmp_path):
    missing = tmp_path / "runs" / "nonexistent" / "dir"
    with pytest.raises(C.ConfigError) as err:
        cfg_from(["--resume", str(missing)])
    assert str(err.value) == f"--resume {missing}: no such run directory or checkpoint file"
    with pytest.raises(C.ConfigError, match=f"--resume {tmp_path}: not a run directory"):
        cfg_from(["--resume", str(tmp_path)])
    stray = tmp_path / "ckpt-000000000064.h5"
    stray.write_bytes(b"")
    with pytest.raises(C.ConfigError, match=f"--resume {stray}: no config.json in .*RUN_DIR/checkpoints"):
        cfg_from(["--resume", str(stray)])


def test_resume_from_a_checkpoint_file_finds_its_run_directory(tmp_path, monkeypatch):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text(cfg_from([]).to_json())
    (run / "checkpoints" / "ckpt-000000000064.h5").write_bytes(b"")     # verified later, on rank 0
    assert cfg_from(["--resume", str(run / "checkpoints" / "ckpt-000000000064.h5")]).train.run_dir == str(run)
    monkeypatch.chdir(run / "checkpoints")                              # a bare file name
    assert cfg_from(["--resume", "ckpt-000000000064.h5"]).train.run_dir == str(run)


def test_config_errors_exit_2_with_one_line_naming_the_path(tmp_path):
    """As a real process: the cases that used to train (nan/inf) or exit 1 with a bare errno."""
    from helpers import one_line_error, run_cli
    cases = [(["--lr", "nan"], "schedule.lr: expected a finite number"),
             (["--lr", "inf"], "schedule.lr: expected a finite number"),
             (["--config", str(tmp_path)], f"{tmp_path}: is a directory"),
             (["--resume", "/nonexistent/dir"], "--resume /nonexistent/dir: no such run directory")]
    for argv, needle in cases:
        p = run_cli([*argv, "--run-dir", str(tmp_path / "run")], tmp_path)
        one_line_error(p, needle)
        assert p.returncode == 2, (argv, p.stderr)
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- derived defaults
def test_unset_scale_follows_image_size_and_augment(tmp_path):
    assert cfg_from([]).data.scale == (32.0, 40.0)                       # the demo's, unchanged
    assert cfg_from(["--image-size", "64"]).data.scale == (64.0, 80.0)   # was refused
    assert cfg_from(["--image-size", "224"]).data.scale == (224.0, 280.0)
    assert cfg_from(["--augment", "rrc"]).data.scale == (0.08, 1.0)     # was refused (32 > 1)
    assert cfg_from([], tmp_path, "[data]\nimage_size = 48\n").data.scale == (48.0, 60.0)
    # an explicit scale is kept as given, and still checked against the crop
    assert cfg_from(["--image-size", "64", "--scale", "70,90"]).data.scale == (70.0, 90.0)
    assert cfg_from(["--scale", "33,41"], tmp_path, "[data]\nscale = [32, 40]\n").data.scale == (33, 41)
    with pytest.raises(C.ConfigError, match="multiscale shorter side 32.0 is below data.image_size 64"):
        cfg_from(["--image-size", "64", "--scale", "32,40"])
    with pytest.raises(C.ConfigError, match="multiscale shorter side 32.0 is below data.image_size 64"):
        cfg_from(["--image-size", "64"], tmp_path, "[data]\nscale = [32.0, 40.0]\n")


def test_explicit_keys_are_recorded_and_not_saved(tmp_path):
    cfg = cfg_from(["--lr", "0.1"], tmp_path, "[data]\nbatch_size = 64\n")
    assert {"schedule.lr", "data.batch_size"} <= cfg.explicit
    assert "data.scale" not in cfg.explicit and "explicit" not in cfg.to_dict()
    assert cfg == cfg_from([])                                   # same values, set or derived


@pytest.mark.parametrize("method,ranks,batch,lr", [
    ("single", 1, 64, 0.1),
    ("single", 4, 64, 0.1),              # (refused later: single runs on one rank)
    ("allreduce", 1, 64, 0.1),
    ("allreduce", 4, 16, 0.1),           # = jobs/digits-allreduce.toml
    ("allreduce", 8, 8, 0.1),            # was 64 per rank: 2 steps per epoch of the digits
    ("allreduce", 32, 8, 0.1),           # never below 8 per worker
    ("gossip", 4, 16, 0.1),
    ("easgd", 4, 21, 0.1),               # 3 workers + the server
    ("asgd", 4, 21, 0.1 / 3),            # the server adds 3 workers' updates
    ("asgd", 9, 8, 0.1 / 8),             # = jobs/laptop-asgd8-*.toml's 0.0125
    ("asgd", 1, 64, 0.1),                # (refused later: asgd needs 2 ranks)
])
def test_rank_count_defaults_of_unset_keys(method, ranks, batch, lr, caplog):
    cfg = cfg_from(["--method", method])
    with caplog.at_level("INFO", logger="scalesgd"):
        fit = C.fit_to_world(cfg, ranks)
    assert fit.data.batch_size == batch and fit.schedule.lr == pytest.approx(lr)
    assert fit.explicit == cfg.explicit
    logged = caplog.text
    assert ("data.batch_size not set" in logged) == (batch != 64)
    assert ("schedule.lr not set: asgd uses 0.1 / " in logged) == (lr != 0.1)
    # an explicit value is never changed, whether it came from a flag or a job file
    kept = C.fit_to_world(cfg_from(["--method", method, "--batch-size", "64", "--lr", "0.1"]), ranks)
    assert (kept.data.batch_size, kept.schedule.lr) == (64, 0.1)


def test_asgd_default_lr_under_the_hierarchy_is_over_the_worker_nodes(caplog):
    """With ``--hierarchy node`` only each node group's leader pushes: 9 ranks (8 workers) on 3
    worker nodes divide the base rate by 3; the per-rank batch still splits over all 8 workers.
    The worker-node count only matters with the hierarchy."""
    cfg = cfg_from(["--method", "asgd", "--hierarchy", "node"])
    with caplog.at_level("INFO", logger="scalesgd"):
        fit = C.fit_to_world(cfg, 9, worker_nodes=3)
    assert fit.schedule.lr == pytest.approx(0.1 / 3) and fit.data.batch_size == 8
    assert "asgd uses 0.1 / 3 worker node groups" in caplog.text
    assert C.fit_to_world(cfg, 9, worker_nodes=1).schedule.lr == pytest.approx(0.1)
    flat = cfg_from(["--method", "asgd"])
    assert C.fit_to_world(flat, 9, worker_nodes=3).schedule.lr == pytest.approx(0.1 / 8)


def test_job_files_and_resumed_runs_keep_their_values(tmp_path):
    for method in ("allreduce", "easgd", "asgd", "gossip"):
        cfg = cfg_from(["--config", f"jobs/digits-{method}.toml"])
        assert C.fit_to_world(cfg, 4) == cfg, method
    # a resumed run starts from its saved config.json, so the values derived when it started stay
    run = tmp_path / "run"
    run.mkdir()
    started = C.fit_to_world(cfg_from(["--method", "asgd"]), 4)
    (run / "config.json").write_text(started.to_json())
    resumed = cfg_from(["--resume", str(run)])
    assert C.fit_to_world(resumed, 4).schedule.lr == pytest.approx(0.1 / 3)
    assert C.fit_to_world(resumed, 4).data.batch_size == 21


@pytest.mark.mpi
def test_asgd_default_lr_is_logged_saved_and_used_and_short_epochs_warn_once(tmp_path):
    """A real 3-rank asgd run (2 workers) that sets no lr: rank 0 logs the derived rate once, the
    saved config holds it, the workers train with it; an epoch of 3 steps warns once."""
    import json
    from mpirun import mpi_launcher, mpiexec
    from synth import make_dataset
    from helpers import TINY, run_cli
    if mpiexec() is None:
        pytest.skip("no mpiexec")
    data = make_dataset(tmp_path / "d", n=48, n_val=12, num_classes=4)
    run_dir = tmp_path / "run"
    p = run_cli(["--data", str(data), "--run-dir", str(run_dir), "--method", "asgd",
                 "--schedule", "constant", *TINY], tmp_path, timeout=120, launcher=mpi_launcher(3))
    assert p.returncode == 0, p.stdout + p.stderr
    lr_lines = [ln for ln in p.stderr.splitlines() if "schedule.lr not set" in ln]
    assert lr_lines == ["scalesgd: schedule.lr not set: asgd uses 0.1 / 2 workers = 0.05 (its server "
                        "adds every worker's update); --lr sets it"], p.stderr
    short = [ln for ln in p.stderr.splitlines() if "an epoch is only" in ln]
    assert short == ["scalesgd: warning: an epoch is only 3 step(s) (48 training samples / global batch "
                     "16 = 2 workers x data.batch_size 8): too few updates to train well; a smaller "
                     "--batch-size gives more"], p.stderr
    assert "batch_size not set" not in p.stderr                      # TINY sets --batch-size 8
    import os
    said = [ln for ln in p.stderr.splitlines() if "ranks on this node's" in ln]    # said once, by rank 0
    assert len(said) == (3 > (os.cpu_count() or 1)), p.stderr        # 3 ranks on a 2-core machine: yield
    assert "GPU only" not in p.stderr                                # conv_impl, precision: defaults
    assert json.loads((run_dir / "config.json").read_text())["schedule"]["lr"] == 0.05
    steps = [json.loads(ln) for ln in (run_dir / "metrics" / "rank-1.jsonl").read_text().splitlines()]
    assert {r["lr"] for r in steps if r["kind"] == "step"} == {0.05}


def test_gpu_only_model_keys_on_numpy_warn_once_and_change_nothing(tmp_path):
    """A GPU job file's `conv_impl = cudnn` and `precision = bf16` on a CPU run: kept (one job file
    serves both), one warning line naming both, and the run trains as without them."""
    import json
    from synth import make_dataset
    from helpers import TINY, run_cli
    data = make_dataset(tmp_path / "d", n=48, n_val=12, num_classes=4)
    runs = {}
    for name, extra in (("plain", []), ("gpu", ["--conv-impl", "cudnn", "--precision", "bf16"])):
        p = run_cli(["--data", str(data), "--run-dir", str(tmp_path / name), "--device", "cpu", *TINY,
                     *extra], tmp_path, timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr
        runs[name] = (p, json.loads((tmp_path / name / "summary.json").read_text()))
    warned = [ln for ln in runs["gpu"][0].stderr.splitlines() if "GPU only" in ln]
    assert warned == ["scalesgd: warning: model.conv_impl = cudnn, model.precision = bf16: GPU only; on "
                      "NumPy (CPU convolutions follow model.conv_algo) this changes nothing"], \
        runs["gpu"][0].stderr
    assert "GPU only" not in runs["plain"][0].stderr
    def losses(name):
        lines = (tmp_path / name / "metrics" / "rank-0.jsonl").read_text().splitlines()
        return [r["loss"] for r in map(json.loads, lines) if r["kind"] == "step"]
    assert len(losses("plain")) == 6 and losses("gpu") == losses("plain")       # bit for bit
    assert runs["gpu"][1]["val_top1_accuracy"] == runs["plain"][1]["val_top1_accuracy"]
