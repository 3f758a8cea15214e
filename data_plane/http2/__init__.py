"""HTTP/2 for the RocketMQ 5 gRPC endpoint: frames, HPACK and its Huffman code."""
