"""The local stack (`specwatch up`): the compose services as loopback processes."""
