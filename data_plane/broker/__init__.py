"""The broker: RocketMQ's request processors over the message store (``data_plane.store``)."""
