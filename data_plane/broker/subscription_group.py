"""SubscriptionGroupManager: consumer groups known to the broker, persisted in
``config/subscriptionGroup.json`` as ``{"subscriptionGroupTable": {group: config}}`` with
RocketMQ's field names (consumeEnable, consumeBroadcastEnable, retryQueueNums,
retryMaxTimes, brokerId, whichBrokerWhenConsumeSlowly, consumeMessageOrderly)."""

from __future__ import annotations

from typing import Any

from data_plane.broker.persisted import ConfigFile, SaveBehind

MAX_GROUPS = 100_000


def default_group(name: str) -> dict[str, Any]:
    return {
        "groupName": name,
        "consumeEnable": True,
        "consumeFromMinEnable": True,
        "consumeBroadcastEnable": True,
        "retryQueueNums": 1,
        "retryMaxTimes": 16,
        "brokerId": 0,
        "whichBrokerWhenConsumeSlowly": 1,
        "consumeMessageOrderly": False,
        "notifyConsumerIdsChangedEnable": True,
    }


class SubscriptionGroupManager:
    def __init__(self, path: str, *, auto_create: bool) -> None:
        self.file = ConfigFile(path)
        self.auto_create = auto_create
        self.groups: dict[str, dict[str, Any]] = {}
        self.save_behind: SaveBehind | None = None  # set by a serving broker (_changed)

    def load(self) -> None:
        doc = self.file.load()
        if doc:
            for name, g in (doc.get("subscriptionGroupTable") or {}).items():
                if isinstance(g, dict):
                    merged = default_group(name)
                    merged.update(g)
                    self.groups[name] = merged

    def snapshot(self) -> dict[str, Any]:
        """The document to save, copied (a group's config is changed in place), so that it can
        be written on another thread."""
        return {"subscriptionGroupTable": {name: dict(g) for name, g in self.groups.items()}}

    def persist(self) -> None:
        self.file.save(self.snapshot())

    def _changed(self, behind: bool) -> None:
        """Saved now — or, with ``behind`` and a serving broker's ``save_behind``, on a worker
        thread for a caller that awaits ``save_behind.saved()`` (an admin request)."""
        if behind and self.save_behind is not None:
            self.save_behind.changed()
        else:
            self.persist()

    def find(self, group: str) -> dict[str, Any] | None:
        g = self.groups.get(group)
        if g is None and self.auto_create and len(self.groups) < MAX_GROUPS:
            g = default_group(group)
            self.groups[group] = g
            self._changed(False)
        return g

    def update(self, group: str, changes: dict[str, Any], *, behind: bool = False) -> dict[str, Any]:
        g = self.groups.get(group) or default_group(group)
        allowed = set(default_group(group))
        g.update({k: v for k, v in changes.items() if k in allowed and k != "groupName"})
        self.groups[group] = g
        self._changed(behind)
        return g

    def delete(self, group: str, *, behind: bool = False) -> bool:
        if self.groups.pop(group, None) is None:
            return False
        self._changed(behind)
        return True
