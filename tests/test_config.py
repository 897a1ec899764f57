"""Typed config: defaults, TOML + flag precedence, every kind of bad key or value named."""
import pytest

from scalesgd import config as C
from scalesgd.cli import make_parser, resolve_config


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
    assert C.reference_markdown() in text, "docs/cli.md is stale: regenerate its table (see config.py)"
    for section in C.SECTIONS:
        for f, _ in C.fields_of(section):
            assert f"`--{C.flag_name(section, f.name).replace('_', '-')}" in text, f.name
