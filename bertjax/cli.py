"""`bertjax <command>`: each command lives in its own module under bertjax/commands and is imported only when run.

A command module defines `HELP` (one line), `add_arguments(parser)` and `run(args) -> int | None`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys

# command name -> module. Add a line here to add a command.
COMMANDS: dict[str, str] = {
    "convert": "bertjax.commands.convert",
    "prepare": "bertjax.commands.prepare",
    "pretrain": "bertjax.commands.pretrain",
    "fill-mask": "bertjax.commands.fill_mask",
    "compile-check": "bertjax.commands.compile_check",
    "finetune": "bertjax.commands.finetune",
    "predict": "bertjax.commands.predict",
    "glue": "bertjax.commands.glue",
    "embed": "bertjax.commands.embed",
    "search": "bertjax.commands.search",
    "train-embedder": "bertjax.commands.train_embedder",
    "init-from": "bertjax.commands.init_from",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bertjax", description="The BERT family of encoders in JAX/Flax.")
    parser.add_argument("--version", action=_PrintVersion)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        command = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(command)
        command.set_defaults(_run=module.run)
    return parser


class _PrintVersion(argparse.Action):
    """--version: one line, unwrapped (argparse's own version action folds it at the terminal's width)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="print the versions of bertjax, JAX, jaxlib, Flax, Optax, Orbax and Grain, then exit")

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_line())
        parser.exit()


def version_line() -> str:
    """bertjax's version and those of the libraries its numbers depend on (what a bug report needs)."""
    from importlib.metadata import PackageNotFoundError, version

    from bertjax import __version__

    found = []
    for name in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "grain"):
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            pass
    return f"bertjax {__version__} ({', '.join(found)})"


def main(argv: list[str] | None = None) -> int:
    import jax

    from bertjax.cpu_allocator import reuse_freed_memory
    from bertjax.platforms import quiet_start

    quiet_start()  # before any command touches a JAX backend: no libtpu noise on CPU/GPU machines
    if jax.config.jax_platforms == "cpu":  # JAX_PLATFORMS=cpu, or quiet_start on a machine without accelerators
        reuse_freed_memory()  # before XLA starts its threads: each step's temporaries are reused, not page-faulted
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    _take_late_overrides(parser, args, extra)
    from bertjax.train.distributed import catch_setup_interrupts
    restore_signals = catch_setup_interrupts()
    try:
        return int(args._run(args) or 0)
    except (ValueError, FileNotFoundError) as error:
        # Bad input (config, file, checkpoint) is reported in one line, not a traceback.
        print(f"bertjax {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"bertjax {args.command}: interrupted", file=sys.stderr)
        return 130  # the shell's status for a process ended by SIGINT
    except BrokenPipeError:
        from bertjax.train.session_outputs import output_closed, quiet_closed_outputs

        if not (output_closed(1) or output_closed(2)):  # a socket of the command's own, not its output
            raise
        # `bertjax search ... | head`: the reader has what it wanted. End as the tools at the head of a pipe do, by
        # SIGPIPE's status, without a traceback (or Python's "Exception ignored" at exit) into the dead pipe.
        quiet_closed_outputs()
        return 128 + signal.SIGPIPE
    except OSError as error:  # a path under a file, a permission, a full disk: named by the OS, in one line
        print(f"bertjax {args.command}: error: {error}", file=sys.stderr)
        return 2
    finally:
        restore_signals()


def entry() -> None:
    """The `bertjax` command: `main`, ended after an interrupt without the interpreter's teardown. The command has
    unwound (checkpoints saved, half-made outputs removed) by then, but threads of XLA or of the data pipeline that
    the interrupt left running can crash the teardown (a SIGSEGV instead of status 130)."""
    try:
        code = main()
    except KeyboardInterrupt:  # before main's own handling began (importing JAX takes seconds)
        print("bertjax: interrupted", file=sys.stderr)
        code = 130
    if code == 130:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def _take_late_overrides(parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str]) -> None:
    """`key=value` overrides are accepted anywhere on the line: argparse gives the positional list only the run
    before the first later flag (`--config c a=1 --workdir w b=2` leaves `b=2` over), so the rest join it here."""
    overrides = [item for item in extra if "=" in item and not item.startswith("-")]
    unknown = [item for item in extra if item not in overrides]
    if unknown or (overrides and not isinstance(getattr(args, "overrides", None), list)):
        parser.error(f"unrecognized arguments: {' '.join(unknown or overrides)}")
    if overrides:
        args.overrides = [*args.overrides, *overrides]


if __name__ == "__main__":
    sys.exit(main())
