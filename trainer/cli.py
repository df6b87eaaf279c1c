"""`sao train`, `sao value-pretrain`, `sao runs` (build step 7)."""
from harness.errors import NotBuiltYet


def _not_built(args):
    raise NotBuiltYet("build step 7: asynchronous SAO training")


def register(sub, add_config_args):
    for name, help_ in [("train", "asynchronous SAO training"),
                        ("value-pretrain", "regress the critic on Monte-Carlo returns of stored traces"),
                        ("runs", "inspect run directories (plot curves)")]:
        p = sub.add_parser(name, help=help_)
        add_config_args(p)
        p.set_defaults(func=_not_built)
