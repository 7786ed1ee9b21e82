"""Silences, at their sources, what a worker process would print that its user cannot act on; imported by every
worker process (`digenrl_verl.platform.process_env`: verl imports it with ``VERL_USE_EXTERNAL_MODULES``).

- transformers' "`CLIPImageProcessor` requires torchvision (not installed); falling back to
  `CLIPImageProcessorPil`" notice: diffusers' pipelines name the torchvision-backed image processors, and
  transformers substitutes its PIL ones, which these pipelines' training never calls. transformers has no knob for
  this one notice (``TRANSFORMERS_VERBOSITY`` would hide all its warnings), so a filter on the logger that emits it
  drops that notice and nothing else.
- diffusers' "Loading pipeline components..." bars (`diffusers.utils.logging.disable_progress_bar`; diffusers reads
  no environment variable for it). transformers' "Loading weights" bars are off through ``HF_HUB_DISABLE_PROGRESS_BARS``
  in the workers' environment (`digenrl_verl.trainer.ray_runtime.WORKER_ENV`). A worker's bars reach the console
  through Ray one refresh per line; its load time is in the run's start-up summary (`startup/model_load_s`).
"""

from __future__ import annotations

from digenrl_verl.platform.filters import drop_message

TORCHVISION_LOGGER = "transformers.utils.import_utils"
TORCHVISION_NOTICE = "requires torchvision (not installed); falling back to"


def install() -> None:
    drop_message(TORCHVISION_LOGGER, TORCHVISION_NOTICE)
    try:
        from diffusers.utils import logging as diffusers_logging
    except ImportError:  # a worker without diffusers loads no pipeline
        return
    diffusers_logging.disable_progress_bar()


install()
