"""Callback for scripts/benchmark.py: when each play starts and how many task results it had.

Writes one JSON line per play to $GPULAB_TIMELINE: {"stage", "play", "start", "end", "ran",
"changed", "tasks"}, counting task results per host (skipped ones not). "tasks" lists each task of the
play in order: {"name", "s" (from its start to the next task's), "ran" (results, skipped ones not)}. The stage is the play's tag other than
"always" and "never" (site.yml tags every play with its stage). Enabled only by the benchmark (ANSIBLE_CALLBACKS_ENABLED); nothing else loads it.
"""

from __future__ import annotations

import json
import os
import time

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
name: gpulab_timeline
type: aggregate
short_description: Per-play start and end times and task counts, for scripts/benchmark.py
description:
  - Appends one JSON line per play to the file named by the environment variable C(GPULAB_TIMELINE).
requirements:
  - enabled in ANSIBLE_CALLBACKS_ENABLED
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "gpulab_timeline"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self._path = os.environ.get("GPULAB_TIMELINE")
        self._play = None

    def _close(self):
        self._task_end()
        if self._play is not None and self._path:
            self._play["end"] = time.time()
            with open(self._path, "a", encoding="utf-8") as f:
                f.write(json.dumps(self._play) + "\n")
        self._play = None

    def v2_playbook_on_play_start(self, play):
        self._close()
        tags = sorted(t for t in play.tags if t not in ("always", "never"))
        self._play = {
            "stage": tags[0] if tags else "untagged",
            "play": play.get_name(),
            "start": time.time(),
            "ran": 0,
            "changed": 0,
            "tasks": [],
        }

    def _task_end(self):
        if self._play is not None and self._play["tasks"] and "s" not in self._play["tasks"][-1]:
            task = self._play["tasks"][-1]
            task["s"] = round(time.time() - task.pop("start"), 3)

    def _task_start(self, task):
        self._task_end()
        if self._play is not None:
            name = task.get_name()
            self._play["tasks"].append({"name": name, "start": time.time(), "ran": 0})

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._task_start(task)

    def v2_playbook_on_handler_task_start(self, task):
        self._task_start(task)

    def _ran(self, result):
        if self._play is not None:
            self._play["ran"] += 1
            if self._play["tasks"]:
                self._play["tasks"][-1]["ran"] += 1
            self._play["changed"] += bool(result._result.get("changed"))

    def v2_runner_on_ok(self, result):
        self._ran(result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._ran(result)

    def v2_playbook_on_stats(self, stats):
        self._close()
