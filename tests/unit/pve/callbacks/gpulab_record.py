"""Test-only callback: every task result and the final stats as JSON lines in $GPULAB_RECORD."""

import json
import os

from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "gpulab_record"
    CALLBACK_NEEDS_ENABLED = True

    def _write(self, record):
        with open(os.environ["GPULAB_RECORD"], "a") as fh:
            fh.write(json.dumps(record, default=str) + "\n")

    def _result(self, result, status):
        self._write(
            {
                "task": result._task.get_name(),
                "action": result._task.action,
                "host": result._host.get_name(),
                "status": status,
                "result": result._result,
            }
        )

    def v2_runner_on_ok(self, result):
        self._result(result, "ok")

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._result(result, "failed")

    def v2_playbook_on_stats(self, stats):
        self._write({"stats": {h: stats.summarize(h) for h in sorted(stats.processed)}})
