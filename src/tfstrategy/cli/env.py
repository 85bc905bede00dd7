"""``tfstrategy env``: a copy-pasteable report of where this host and process stand."""

from __future__ import annotations

import argparse
import json

from tfstrategy.cli._common import add_output_arguments, import_tensorflow_quietly

__all__ = ["DESCRIPTION", "env_parser"]

DESCRIPTION = """\
Print versions (tfstrategy, TensorFlow, Keras and which flavour tf.keras is,
Python, platform), TensorFlow's build (CUDA/cuDNN it was built with), physical
and logical devices with GPU names, CUDA_VISIBLE_DEVICES, TF_CONFIG (parsed and
checked), Slurm and TFSTRATEGY_* variables, and what tfstrategy.select() would
choose here and why. Paste it into bug reports; read it to answer "why do I see
1 replica?".

It reads devices without starting TensorFlow's runtime or initialising a GPU.
Problems found (a bad TF_CONFIG, settings select() would refuse) are listed as
"Problem" lines; the exit status is still 0, since the report itself succeeded.

examples:
  tfstrategy env                                   # the report
  tfstrategy env --json                            # one JSON object for scripts
  TF_CONFIG="$(cat tf_config.json)" tfstrategy env # check a cluster config
  TFSTRATEGY_CPU_REPLICAS=4 tfstrategy env         # what select() would do with 4 CPU replicas
  tfstrategy env --compat                          # which private TF/Keras names resolve on this install
"""


def env_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``env``."""
    parser = subparsers.add_parser(
        "env",
        help="report versions, devices, TF_CONFIG and what select() would choose (for bug reports)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_output_arguments(parser, json_help="print one JSON object (every field, parsed TF_CONFIG, all SLURM_*)")
    parser.add_argument("--compat", action="store_true",
                        help="check every private TensorFlow/Keras name tfstrategy uses (imports their modules, "
                             "a few seconds) and list each accessor as resolved or MISSING")
    parser.set_defaults(command=env_command)
    return parser


def env_command(args: argparse.Namespace) -> int:
    """Print the report; return the exit status."""
    import_tensorflow_quietly(args.debug)
    from tfstrategy.diagnostics.env_report import collect_env_report, env_report_as_dict, format_env_report

    report = collect_env_report(compat=args.compat)
    if args.json:
        print(json.dumps(env_report_as_dict(report), indent=2))
    else:
        print("Copy-and-paste the text below in your GitHub issue.\n")
        print(format_env_report(report))
    return 0
