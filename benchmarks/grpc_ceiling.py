"""What grpc.aio itself allows on this machine: a MessagingService whose handlers do nothing,
driven the way ``orbit bench e2e``'s gRPC phases drive the broker (16 unary callers in 2
processes; receivers of 32-message streams). The broker's gRPC figures cannot pass these.

    python -m benchmarks.grpc_ceiling [--seconds 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import sys
import time
from typing import Any

from benchmarks.output import emit, header


def _serve(port_out: Any, seconds: float) -> None:
    import grpc
    import uvloop

    from data_plane.proxy.v2 import definition_pb2 as pb
    from data_plane.proxy.v2 import service_pb2 as rpc
    from data_plane.proxy.v2 import service_pb2_grpc

    message = pb.Message(topic=pb.Resource(name="t"), body=b"x" * 1024)

    class Nothing(service_pb2_grpc.MessagingServiceServicer):
        async def SendMessage(self, request: Any, context: Any) -> Any:
            return rpc.SendMessageResponse(status=pb.Status(code=pb.OK))

        async def ReceiveMessage(self, request: Any, context: Any) -> Any:
            yield rpc.ReceiveMessageResponse(status=pb.Status(code=pb.OK))
            for _ in range(32):
                yield rpc.ReceiveMessageResponse(message=message)

    async def main() -> None:
        server = grpc.aio.server()
        service_pb2_grpc.add_MessagingServiceServicer_to_server(Nothing(), server)  # type: ignore[no-untyped-call]
        port_out.put(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        await asyncio.sleep(seconds * 2 + 10)
        await server.stop(None)

    uvloop.run(main())


def _drive(kind: str, endpoint: str, lanes: int, seconds: float) -> int:
    import grpc
    import uvloop

    from data_plane.proxy.v2 import definition_pb2 as pb
    from data_plane.proxy.v2 import service_pb2 as rpc
    from data_plane.proxy.v2 import service_pb2_grpc

    async def main() -> int:
        done = 0
        async with grpc.aio.insecure_channel(endpoint) as channel:
            stub = service_pb2_grpc.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]
            stop = time.perf_counter() + seconds

            async def lane() -> None:
                nonlocal done
                while time.perf_counter() < stop:
                    if kind == "unary":
                        await stub.SendMessage(rpc.SendMessageRequest(messages=[pb.Message()]))
                        done += 1
                    else:
                        async for r in stub.ReceiveMessage(rpc.ReceiveMessageRequest()):
                            done += r.HasField("message")

            await asyncio.gather(*(lane() for _ in range(lanes)))
        return done

    result: int = uvloop.run(main())
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    ctx = multiprocessing.get_context("spawn")
    ports: Any = ctx.Queue()
    server = ctx.Process(target=_serve, args=(ports, args.seconds))
    server.start()
    endpoint = f"127.0.0.1:{ports.get(timeout=30)}"
    out: dict[str, Any] = {**header("grpc_ceiling", argv), "seconds": args.seconds}
    with ctx.Pool(2) as pool:
        for kind, key in (("unary", "unary_calls_per_s"), ("stream", "streamed_messages_per_s")):
            counts = pool.starmap(_drive, [(kind, endpoint, 8, args.seconds)] * 2)
            out[key] = round(sum(counts) / args.seconds)
    server.terminate()
    server.join()
    emit(out, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
