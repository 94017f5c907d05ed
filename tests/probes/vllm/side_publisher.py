"""Runs vLLM's own ``ZmqEventPublisher`` in the side environment (the one with the official
vllm==0.33.0 wheel; see tests/probes/vllm/side_env.sh), driven line by line on stdin:

    start ENDPOINT REPLAY_ENDPOINT TOPIC [RANK]  create a publisher for dp rank RANK (0); vLLM
                                            offsets both ports by the rank itself
    publish H1,H2,... [RANK]                one KVEventBatch: BlockStored(GPU) of the hashes,
                                            BlockStored(CPU) of the first, BlockRemoved(GPU) of the last
    clear [RANK]                            one KVEventBatch with AllBlocksCleared
    stop [RANK]                             shut the publisher down (a restart is stop + start)
    quit

Each command answers one line, ``ok`` or ``error: ...``. Not a test module: the test spawns it.
"""

import sys
import time


def main() -> None:
    from vllm.distributed.kv_events import (
        AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, ZmqEventPublisher,
    )

    publishers = {}
    print("ready", flush=True)
    for line in sys.stdin:
        cmd, *args = line.split()
        try:
            if cmd == "start":
                endpoint, replay, topic, rank = (args + ["", "", "", "0"][len(args):])[:4]
                publishers[int(rank)] = ZmqEventPublisher(
                    int(rank), endpoint=endpoint, replay_endpoint=replay, topic=topic)
            elif cmd == "quit":
                break
            else:
                rank_args = args[1:] if cmd == "publish" else args
                rank = int(rank_args[0]) if rank_args else 0
                publisher = publishers.get(rank)
            if cmd == "publish":
                hashes = [int(h) for h in args[0].split(",")]
                events = [BlockStored(block_hashes=hashes, parent_block_hash=None,
                                      token_ids=list(range(4 * len(hashes))), block_size=4,
                                      lora_id=None, medium="GPU", lora_name=None),
                          BlockStored(block_hashes=hashes[:1], parent_block_hash=None,
                                      token_ids=[], block_size=0, lora_id=None, medium="CPU",
                                      lora_name=None, group_idx=0),
                          BlockRemoved(block_hashes=hashes[-1:], medium="GPU")]
                publisher.publish(KVEventBatch(ts=time.time(), events=events))
            elif cmd == "clear":
                publisher.publish(KVEventBatch(ts=time.time(), events=[AllBlocksCleared()]))
            elif cmd == "stop":
                publishers.pop(rank).shutdown()
            print("ok", flush=True)
        except Exception as exc:  # report, keep serving
            print(f"error: {exc!r}", flush=True)
    for publisher in publishers.values():
        publisher.shutdown()


if __name__ == "__main__":
    main()
