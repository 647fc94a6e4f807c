"""`ConcurrencySteps`: a LoadTestShape that holds each concurrency level for a fixed time, then stops."""

from typing import Any

from locust import LoadTestShape, events


@events.init_command_line_parser.add_listener
def _arguments(parser: Any) -> None:
    parser.add_argument("--levels", default="1,8,16", include_in_web_ui=True, help="concurrency levels, in order")
    parser.add_argument("--step-seconds", type=float, default=60.0, include_in_web_ui=True,
                        help="how long each level is held")


class ConcurrencySteps(LoadTestShape):
    """Levels from `--levels`, each held `--step-seconds`; users spawn at once (closed loop at each level)."""

    levels: tuple[int, ...] = (1, 8, 16)
    step_seconds = 60.0

    def tick(self) -> tuple[int, float] | None:
        options = self.runner.environment.parsed_options if self.runner else None
        levels = tuple(int(x) for x in options.levels.split(",")) if options else self.levels
        step = options.step_seconds if options else self.step_seconds
        index = int(self.get_run_time() // step)
        if index >= len(levels):
            return None
        return levels[index], float(levels[index])
