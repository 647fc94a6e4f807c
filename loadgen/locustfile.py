"""Fixed-concurrency load: `locust -f loadgen/locustfile.py --host URL --workloads code=data/code.jsonl,...`."""

import locust  # noqa: F401  (first: gevent patching)

from specwatch.load.locustfile import ChatUser  # noqa: F401  (Locust discovers it here)
