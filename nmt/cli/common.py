"""What every entry point shares: composing recipes with Hydra, and turning user errors into one line."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from dataclasses import fields, is_dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from nmt.config import (
    AverageConfig,
    CompareConfig,
    Config,
    EvaluateConfig,
    ExportConfig,
    ServeConfig,
    ShortlistConfig,
    TranslateConfig,
    register_configs,
    to_object,
)
from nmt.errors import NmtError
from nmt.memory import tune_allocator

# The schema behind each top-level recipe, to list the valid keys when an override names an unknown one.
SCHEMAS = {
    "config": Config,
    "translate": TranslateConfig,
    "evaluate": EvaluateConfig,
    "average": AverageConfig,
    "serve": ServeConfig,
    "compare": CompareConfig,
    "export": ExportConfig,
    "shortlist": ShortlistConfig,
}


PACKAGED_RECIPES = Path(__file__).resolve().parents[1] / "recipes"  # nmt/recipes, installed with the package


def recipes_dir() -> Path:
    """The recipes that come with the package (nmt/recipes)."""
    if not (PACKAGED_RECIPES / "config.yaml").is_file():
        raise NmtError(
            f"the packaged recipes are missing ({PACKAGED_RECIPES}); reinstall the package: pip install "
            "--force-reinstall nmt-attention"
        )
    return PACKAGED_RECIPES


def user_recipe_dirs() -> list[Path]:
    """Folders of the user's own recipes: $NMT_RECIPES, paths separated by ':' (searched after the packaged ones,
    so they add recipes, e.g. DIR/experiment/mine.yaml for experiment=mine, rather than replace them)."""
    dirs = [Path(p).expanduser() for p in os.environ.get("NMT_RECIPES", "").split(os.pathsep) if p.strip()]
    for folder in dirs:
        if not folder.is_dir():
            raise NmtError(
                f"NMT_RECIPES={os.environ['NMT_RECIPES']}: {folder} is not a folder; "
                "expected folders of recipes (GROUP/NAME.yaml)"
            )
    return dirs


def _one_line(message: str) -> str:
    """Hydra's multi-line messages folded into one line, without the search-path dump."""
    message = message.split("Config search path")[0]
    return " ".join(part.strip() for part in message.splitlines() if part.strip())


def compose(config_name: str, overrides: list[str]):
    """Compose recipes/<config_name>.yaml with command-line overrides into plain dataclasses."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException

    register_configs()
    check_sweeps(overrides)
    check_group_choices(overrides)
    try:
        searchpath = (
            [f"hydra.searchpath=[{','.join('file://' + str(p.resolve()) for p in user_recipe_dirs())}]"]
            if user_recipe_dirs()
            else []
        )
        with initialize_config_dir(str(recipes_dir()), version_base="1.3", job_name="nmt"):
            cfg = hydra_compose(config_name=config_name, overrides=searchpath + overrides)
        obj = to_object(cfg)
    except (HydraException, OmegaConfBaseException) as err:
        raise NmtError(compose_error(err, config_name)) from None
    check_known_keys(obj)
    return obj


def top_level_commas(value: str) -> bool:
    """Whether a value holds a comma outside brackets, braces, quotes and backslash escapes (Hydra's sweep form)."""
    depth, quote, escaped = 0, "", False
    for char in value:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{(":
            depth += 1
        elif char in "]})":
            depth -= 1
        elif char == "," and depth == 0:
            return True
    return False


def check_sweeps(overrides: list[str]) -> None:
    """`key=a,b` is Hydra's sweep (several runs, under --multirun), which no nmt command runs: name the key and the
    two forms meant instead, a list or one value."""
    for override in overrides:
        key, sep, value = override.lstrip("+~").partition("=")
        if sep and top_level_commas(value):
            raise NmtError(
                f"{key}={value}: one value, or a list written {key}=[{value}] (with brackets: Hydra reads "
                f"{key}=a,b as a sweep over several runs, which the nmt commands do not run)"
            )


def check_group_choices(overrides: list[str]) -> None:
    """An unknown recipe name in any group (`experiment=typo` too, which Hydra skips as optional) lists the valid
    ones."""
    groups = group_options()
    for override in overrides:
        name, _, value = override.lstrip("+~").partition("=")
        if name in groups and value not in groups[name] and value != "null":
            raise NmtError(
                f"{name}={value}: no such recipe in recipes/{name}/; expected one of {', '.join(groups[name])}"
            )


def check_known_keys(obj: object, path: str = "") -> None:
    """Refuse keys the schema lacks (a `+KEY=VALUE` override adds them without complaint)."""
    known = [f.name for f in fields(obj)]
    for name, value in vars(obj).items():
        if name not in known:
            where = f"in {path.rstrip('.')}" if path else "at the top level"
            raise NmtError(f"{path}{name}: unknown key '{name}'; valid keys {where}: {', '.join(known)}")
        if is_dataclass(value):
            check_known_keys(value, f"{path}{name}.")


_WRONG_TYPE = re.compile(
    r"Error merging override (\S+=.*?): Value .* (?:could not be converted to|is not a valid) (\w+)"
)
_TYPE_WORDS = {"Integer": "a whole number", "Float": "a number", "bool": "true or false"}


def compose_error(err: Exception, config_name: str) -> str:
    """One line for a composition error: the key, what is wrong, and for an unknown key the valid ones."""
    cause = err.__cause__ if isinstance(err.__cause__, OmegaConfBaseException) else err
    key = getattr(cause, "full_key", None)
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and key and config_name in SCHEMAS:
        parent, _, name = key.rpartition(".")
        node = OmegaConf.structured(SCHEMAS[config_name])
        keys = OmegaConf.select(node, parent) if parent else node
        if isinstance(keys, DictConfig):
            where = f"in {parent}" if parent else "at the top level"
            return f"{key}: unknown key '{name}'; valid keys {where}: {', '.join(keys)}"
    message = _one_line(str(err))
    if cause is not err:
        message += f": {str(cause).splitlines()[0]}"
    if wrong_type := _WRONG_TYPE.match(
        message
    ):  # "Error merging override K=V: Value 'V' of type 'str' could not be converted to Integer"
        override, wanted = wrong_type.groups()
        return f"{override}: expected {_TYPE_WORDS.get(wanted, wanted.lower())}"
    return message


def group_options() -> dict[str, list[str]]:
    """The choices of each recipe group (GROUP/NAME.yaml in the packaged recipes and the user's folders)."""
    groups: dict[str, set[str]] = {}
    for root in [recipes_dir(), *user_recipe_dirs()]:
        for group in root.iterdir():
            if group.is_dir() and not group.name.startswith(("_", ".")):
                groups.setdefault(group.name, set()).update(p.stem for p in group.glob("*.yaml"))
    return {name: sorted(choices) for name, choices in sorted(groups.items())}


def print_help(usage: str) -> None:
    print(usage.strip())
    print("\nRecipe groups (choose with GROUP=NAME):")
    for group, names in group_options().items():
        print(f"  {group}: {', '.join(names)}")


def run(main: Callable[[list[str]], int | None], argv: list[str] | None = None) -> None:
    """Call main(argv) and exit: 0 on success, 2 with one line on stderr for a user error.

    NMT_DEBUG=1 (or --debug) shows the traceback instead.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = os.environ.get("NMT_DEBUG") == "1" or "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    tune_allocator()
    try:
        code = main(argv) or 0
    except NmtError as err:
        if debug:
            raise
        print(f"error: {err}", file=sys.stderr)
        code = err.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = 130
    sys.exit(code)
