"""Haystacks: corpus text, needle sets, task prompts, and building trial contexts from them."""

from .context import TrialContext, build_context
from .corpus import Haystack, load_haystack
from .needles import Needle, load_needles
from .tasks import TaskSample, load_tasks

__all__ = ["Haystack", "Needle", "TaskSample", "TrialContext", "build_context", "load_haystack", "load_needles",
           "load_tasks"]
