"""Where ``ktae eval MODEL`` loads MODEL from: moved to :mod:`ktae.models.model_path`; this
name stays for code written against it."""

from ktae.models.model_path import (  # noqa: F401
    DEFAULT_MODEL,
    HUB_PROBE_TIMEOUT,
    MODEL_FILES,
    hub_cache_dir,
    hub_endpoint,
    hub_offline,
    resolve_model_path,
)
