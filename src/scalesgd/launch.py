"""What every front-end shares before it runs anything: the flags (generated from the config
dataclasses), the resolved config (defaults < TOML job file < flags, resume's saved config), the
dry run, the refusal of an occupied run directory, and the exit codes.  ``cli`` (the MPI program),
``virtual`` (the virtual cluster) and ``virtual.plan`` build on it; it imports none of them, so the
layers below a front-end never reach up to one.
"""
from __future__ import annotations

import argparse
import typing
from pathlib import Path

from . import config as C

EXIT_USAGE, EXIT_ERROR = 2, 1


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        """One line instead of argparse's usage block (the full usage is one --help away)."""
        self.exit(EXIT_USAGE, f"scalesgd: error: {message} (see --help)\n")


def make_parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog="scalesgd", description="Train a ResNet with distributed SGD over MPI "
        "(defaults: the built-in digits demo).", argument_default=argparse.SUPPRESS)
    sections = " ".join(f"[{s}]" for s in C.SECTIONS)
    ap.add_argument("--config", help=f"TOML job file (sections {sections}); flags override it")
    ap.add_argument("--dry-run", action="store_true", help="print the resolved config and the "
                    "parameter count, then exit")
    from ._version import version
    ap.add_argument("--version", action="version", version=f"scalesgd {version()}")
    defaults = C.Config()
    for section in C.SECTIONS:
        group = ap.add_argument_group(f"[{section}]")
        hints = typing.get_type_hints(C.SECTIONS[section])
        for f, meta in C.fields_of(section):
            flag = "--" + C.flag_name(section, f.name).replace("_", "-")
            default = getattr(getattr(defaults, section), f.name)
            shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
            helptext = f"{meta.get('help', '')} (default: {shown!s})".replace("%", "%%")
            kw = dict(dest=f"{section}.{f.name}", help=helptext)
            if hints[f.name] is bool:
                group.add_argument(flag, action=argparse.BooleanOptionalAction, **kw)
            else:       # the choices config/ validates against, shown as argparse shows choices
                choices = meta.get("choices")
                metavar = "{" + ",".join(map(str, choices)) + "}" if choices else f.name.upper()
                group.add_argument(flag, metavar=metavar, **kw)
    return ap


EXIT_STOPPED = 75            # stopped on SIGTERM/SIGUSR1 after writing a checkpoint (EX_TEMPFAIL)


def resolve_config(args: argparse.Namespace) -> C.Config:
    """Defaults < TOML file < flags, validated (ConfigError names the key).  With ``resume``, the
    resumed run's saved config.json replaces the defaults, and keys that define the run may not
    change (the error names them)."""
    file_values = C.load_toml(args.config) if getattr(args, "config", None) else {}
    overrides: dict[str, dict] = {}
    for dest, value in vars(args).items():
        if "." in dest:
            section, key = dest.split(".", 1)
            overrides.setdefault(section, {})[key] = value
    cfg = C.build(file_values, overrides)
    if not cfg.train.resume:
        return cfg
    from .train import resuming
    return resuming.resumed_config(cfg, file_values, overrides)


def _num_classes_for_dry_run(cfg: C.Config) -> int:
    from .data.shards import read_manifest
    if not cfg.data.data:
        return 10                      # the built-in digits
    return int(read_manifest(Path(cfg.data.data))["num_classes"])


def refuse_occupied(run_dir: Path) -> None:
    """A new run may not reuse a run directory (the real program, the virtual cluster and both dry
    runs refuse it with this one message)."""
    if (run_dir / "config.json").exists():
        raise C.ConfigError(f"--run-dir {run_dir} already holds a run (its config.json): continue "
                            f"it with --resume {run_dir}, or choose another run directory")


def _train_count(cfg: C.Config) -> tuple[int, Path] | None:
    """(training samples, data root) from the data set's manifest, without building anything; None
    where the manifest does not say (the ranks then check the shards themselves) and for the digits
    not built yet, or built by an older version (the run rebuilds them)."""
    from .data.demo import default_data_dir
    from .data.shards import ShardError, read_manifest
    root = Path(cfg.data.data) if cfg.data.data else default_data_dir()
    try:
        manifest = read_manifest(root)
    except ShardError:
        if cfg.data.data:
            raise                        # the user's data: its one-line error, as the run's
        return None
    count = (manifest["splits"].get("train") or {}).get("count")
    return (count, root) if isinstance(count, int) and not isinstance(count, bool) else None


def dry_run(cfg: C.Config, ranks: int | None = None) -> None:
    """Prints the resolved config and the parameter count; refuses, as the run would before it
    starts, an occupied ``--run-dir`` and, where the rank count is known, a method that cannot run
    on it and a global batch (the one the run would use) larger than the training split."""
    from .nn.resnet import ResNet
    if cfg.train.run_dir and not cfg.train.resume:
        refuse_occupied(Path(cfg.train.run_dir))
    counted = _train_count(cfg) if ranks else None
    if ranks:
        from .methods import check_ranks
        check_ranks(cfg, ranks)
    if counted is not None:
        from .train.assemble import require_one_step
        from .errors import DataError
        workers = C.workers_of(cfg.train.method, ranks, cfg.dist.servers)
        try:
            require_one_step(counted[0], C.fitted_batch(cfg, workers), workers, counted[1])
        except DataError as exc:        # every rank of a launched dry run finds it alike: one says it
            exc.shared = True
            raise
    n_cls = _num_classes_for_dry_run(cfg)
    model = ResNet(cfg.model.model, n_cls, cfg.model.width, cfg.model.zero_init_residual, seed=None)
    print(cfg.to_json())
    print(f"model {cfg.model.model} (width {cfg.model.width}, {n_cls} classes): "
          f"{model.num_params:,} parameters")
