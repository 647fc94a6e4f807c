"""How a run with a request plan ends by itself once every Locust process has sent its plan.

Standalone, Locust stops the run (web UI) or quits (--headless). A worker never quits on its own: Locust sends a
worker's last statistics only when its master stops or quits it, so a worker that quit first took its unreported
requests with it. Instead a worker sends its statistics, then `specwatch_plan_done` (in that order, over its one
connection), and the master ends the run once every worker has sent its plan or runs no users; ending it (--headless:
quit, web UI: stop) collects the workers' last reports as any Locust run does, and the web UI keeps its workers.
"""

from typing import Any

import gevent
from locust import events
from locust.env import Environment
from locust.rpc import Message
from locust.runners import STATE_RUNNING, MasterRunner, Runner, WorkerRunner

PLAN_DONE = "specwatch_plan_done"
DONE: set[str] = set()  # on the master: the workers that have sent their whole plan in this run


def plan_sent(environment: Environment) -> None:
    """This process's last request is in: end the run, or, on a worker, tell the master. In a greenlet of its own,
    so the calling user stops first."""
    gevent.spawn(_plan_sent, environment.runner)


def _plan_sent(runner: Runner | None) -> None:
    if isinstance(runner, WorkerRunner):
        runner._send_stats()  # every request this worker made, ahead of the message that says there are no more
        runner.send_message(PLAN_DONE)
    elif runner is not None:
        _end(runner)


def _end(runner: Runner) -> None:
    options = runner.environment.parsed_options
    if options is not None and options.headless:
        runner.quit()
    else:
        runner.stop()


def _end_if_all_done(runner: MasterRunner) -> None:
    """After spawning, each worker has sent its plan, or has started (running) with no users; a worker still
    spawning, or not yet given its users, holds the end. Stopping sets the state first: a second call does nothing."""
    workers = runner.clients.ready + runner.clients.spawning + runner.clients.running
    if runner.state == STATE_RUNNING and all(
            w.id in DONE or (w.state == STATE_RUNNING and not w.user_count) for w in workers):
        _end(runner)


@events.init.add_listener
def _on_master(environment: Environment, **_: Any) -> None:
    runner = environment.runner
    if not isinstance(runner, MasterRunner):
        return

    def check(**_: Any) -> None:  # in a greenlet: stopping waits for messages that the caller would be handling
        gevent.spawn(_end_if_all_done, runner)

    def worker_done(msg: Message, **_: Any) -> None:
        DONE.add(msg.node_id)
        check()

    runner.register_message(PLAN_DONE, worker_done)
    environment.events.test_start.add_listener(lambda **_: DONE.clear())
    environment.events.spawning_complete.add_listener(check)  # the master is running from here on
    environment.events.worker_report.add_listener(check)  # a worker's users, e.g. none on a late one
