"""Reading settings: the config dataclass helpers (:mod:`~rlserve.config.fields`) and spaces files.

The helpers are re-exported, so ``from rlserve.config import option`` keeps working.
"""

from rlserve.config.fields import (
    CONFIG_TABLES,
    TOKEN_ENV,
    add_arguments,
    build,
    check_table,
    line_of_key,
    load_config_file,
    option,
    to_table,
)

__all__ = [
    "CONFIG_TABLES",
    "TOKEN_ENV",
    "add_arguments",
    "build",
    "check_table",
    "line_of_key",
    "load_config_file",
    "option",
    "to_table",
]
