"""A concurrency sweep: `locust -f loadgen/sweep.py --host URL --workloads ... --levels 1,8,16 --step-seconds 60`."""

import locust  # noqa: F401  (first: gevent patching)

from specwatch.load.locustfile import ChatUser  # noqa: F401
from specwatch.load.shape import ConcurrencySteps  # noqa: F401
