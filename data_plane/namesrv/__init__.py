"""The name server: brokers register their topics here; clients look up which brokers serve a
topic. State lives only in memory and is rebuilt from broker registrations (every 30 s).

``route_info`` holds the tables (pure state), ``codec`` the wire bodies, ``processor`` the
request handlers, ``server`` the process (``orbit namesrv``)."""
