"""RocketMQ 4.x request and response codes (``RequestCode`` / ``ResponseCode`` in the Java
sources). Numbers are the wire's: never renumber. Only the codes Orbit speaks or answers are
listed; an unknown request code is answered with ``REQUEST_CODE_NOT_SUPPORTED``."""

from __future__ import annotations

import enum


class RequestCode(enum.IntEnum):
    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21
    GET_TOPIC_NAME_LIST = 23
    GET_BROKER_RUNTIME_INFO = 28
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_EARLIEST_MSG_STORETIME = 32
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39
    NOTIFY_CONSUMER_IDS_CHANGED = 40
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    GET_ALL_CONSUMER_OFFSET = 43
    CHECK_CLIENT_CONFIG = 46
    REGISTER_BROKER = 103
    UNREGISTER_BROKER = 104
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201
    GET_TOPIC_STATS_INFO = 202
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    DELETE_SUBSCRIPTIONGROUP = 207
    GET_CONSUME_STATS = 208
    DELETE_TOPIC_IN_BROKER = 215
    DELETE_TOPIC_IN_NAMESRV = 216
    GET_CONSUMER_RUNNING_INFO = 307
    SEND_MESSAGE_V2 = 310
    SEND_BATCH_MESSAGE = 320
    # Orbit's own (outside RocketMQ's numbering): the control plane's reconciler sends a broker
    # the whole tenancy snapshot — credentials, tenant status, quota shares (docs/broker.md).
    ORBIT_SYNC_TENANCY = 9001
    # A message's broker-side trace (stored, delivered, consumed, …): ext topic, msgId →
    # {"events": [...]} (docs/filters_and_trace.md).
    QUERY_MESSAGE_TRACE = 9002


class ResponseCode(enum.IntEnum):
    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    TRANSACTION_FAILED = 4
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    VERSION_NOT_SUPPORTED = 15
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    TOPIC_EXIST_ALREADY = 18
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    TRANSACTION_SHOULD_COMMIT = 200
    TRANSACTION_SHOULD_ROLLBACK = 201
    TRANSACTION_STATE_UNKNOW = 202
    CONSUMER_NOT_ONLINE = 206
    NO_MESSAGE = 208
    # A tenant over its quota (what managed RocketMQ services answer): the remark carries
    # "retry-after-ms=<n>"; the client backs off that long and retries.
    FLOW_CONTROL = 215


# Bits of a command's ``flag``.
FLAG_RESPONSE = 1
FLAG_ONEWAY = 2

# A message's ``sysFlag`` bits (MessageSysFlag).
SYS_FLAG_COMPRESSED = 0x1
SYS_FLAG_MULTI_TAGS = 0x2
SYS_FLAG_TRANSACTION_PREPARED = 0x4
SYS_FLAG_TRANSACTION_COMMIT = 0x8
SYS_FLAG_TRANSACTION_ROLLBACK = 0xC

# A pull request's ``sysFlag`` bits (PullSysFlag).
PULL_FLAG_COMMIT_OFFSET = 0x1
PULL_FLAG_SUSPEND = 0x2
PULL_FLAG_SUBSCRIPTION = 0x4
PULL_FLAG_CLASS_FILTER = 0x8

# Topic permissions (PermName).
PERM_INHERIT = 0x1
PERM_WRITE = 0x2
PERM_READ = 0x4
PERM_READ_WRITE = PERM_READ | PERM_WRITE
