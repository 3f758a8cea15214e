"""The RPCs of ``MessagingService`` that Orbit does not serve (offset-based pulls, lite topics),
answered as RocketMQ's proxy answers what it does not support: the status ``UNSUPPORTED``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from data_plane.proxy.v2 import definition_pb2 as pb
from data_plane.proxy.v2 import service_pb2 as rpc

Context = grpc.aio.ServicerContext[Any, Any]


class Unsupported:
    async def _unsupported_status(self, context: Context, what: str) -> pb.Status:
        return pb.Status(code=pb.UNSUPPORTED, message=f"{what} is not supported by this endpoint")

    async def PullMessage(self, request: rpc.PullMessageRequest, context: Context) -> AsyncIterator[Any]:
        yield rpc.PullMessageResponse(status=await self._unsupported_status(context, "PullMessage"))

    async def UpdateOffset(self, request: rpc.UpdateOffsetRequest, context: Context) -> Any:
        return rpc.UpdateOffsetResponse(status=await self._unsupported_status(context, "UpdateOffset"))

    async def GetOffset(self, request: rpc.GetOffsetRequest, context: Context) -> Any:
        return rpc.GetOffsetResponse(status=await self._unsupported_status(context, "GetOffset"))

    async def QueryOffset(self, request: rpc.QueryOffsetRequest, context: Context) -> Any:
        return rpc.QueryOffsetResponse(status=await self._unsupported_status(context, "QueryOffset"))

    async def SyncLiteSubscription(self, request: rpc.SyncLiteSubscriptionRequest, context: Context) -> Any:
        what = "SyncLiteSubscription (lite topics)"
        return rpc.SyncLiteSubscriptionResponse(status=await self._unsupported_status(context, what))
