"""RocketMQ 4.x "remoting": the wire protocol (``command``), connections (``connection``),
a server and a client. Shared by the name server, the broker and the SDK."""
